// Delayed-scaling state: amax histories and scales of every FP8 tensor in the model, as
// Transformer Engine's fp8 meta, with TE's update rule (transformer_engine/common/recipe/
// delayed_scaling.cu, the bulk "after reduction" variant).
//
// Slots. Each FP8 GEMM site (a linear layer) owns five slots: forward input, weight, output and
// backward grad_output, grad_input. All forward slots come first (gemm * 3 + role), then all
// backward slots (3 * num_gemms + gemm * 2 + role), so each pass is one contiguous range.
//
// Storage. history is [history_len][num_slots] (row-major): row 0 is the amax being recorded during
// the current step (quantizers max-accumulate into it), rows 1..len-1 are completed steps, oldest
// first (row len-1 is the most recent). Because row 0 is contiguous over all slots, one all-reduce
// (MAX) of num_slots floats synchronizes every amax across tensor-parallel ranks.
//
// Update (every `interval` steps), per slot:
//   amax_now = row 0 (after the reduction)
//   if amax_now != 0:   roll the history one step (rows 1..len-1 shift down, row len-1 = amax_now),
//                       row 0 = 0
//   amax = max over the history (max) or amax_now (most_recent); a slot that saw no data keeps its
//          history untouched and its scale (amax = 0)
//   scale = (fp8_max / amax) / 2^margin, kept when amax is 0, inf or NaN (the max ignores NaNs:
//           max_ignoring_nan of scale_math.h, TE's fmaxf); FLT_MAX when the quotient overflows
//   scale_inv = 1 / scale
// Between updates (interval > 1) row 0 keeps accumulating, so the next update sees the max over
// the whole interval.
//
// Wiring the kernels to it: a delayed cast takes scale = &scale[slot] and amax = &history[slot]
// (row 0). Give each quantized tensor its own scale_inv (the cast writes 1/scale there) rather
// than pointing at this state's scale_inv: a weight quantized before an update must keep the
// factor it was quantized with (Transformer Engine keeps scale_inv in the FP8 tensor for this).
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "fp8/recipe.h"
#include "fp8/scale_math.h"

struct CUstream_st;

namespace fp8tron::fp8 {

// Called with the row-0 amaxes of all slots (host pointer for the CPU state, device pointer for
// the CUDA update); must replace them in place with their maximum over the tensor-parallel group.
using AmaxReduceFn = std::function<void(float* amaxes, size_t n)>;

// Raw view of the scaling buffers, shared by the CPU and CUDA updates.
struct ScalingBuffers {
  float* history = nullptr;    // [history_len][num_slots]
  float* scale = nullptr;      // [num_slots]
  float* scale_inv = nullptr;  // [num_slots]
  size_t history_len = 1;
  size_t num_slots = 0;
};

// Parameters of one update: slots [0, forward_slots) use forward_max, the rest backward_max.
struct DelayedUpdateParams {
  size_t forward_slots = 0;
  float forward_scaled_max = 448.0f;    // fp8_max(forward format) * 2^-margin
  float backward_scaled_max = 57344.0f;  // fp8_max(backward format) * 2^-margin
  AmaxComputeAlgo algo = AmaxComputeAlgo::kMostRecent;
  size_t slot_begin = 0;  // update only [slot_begin, slot_end)
  size_t slot_end = 0;
};

DelayedUpdateParams delayed_update_params(const DelayedScaling& recipe, size_t num_gemms);

// The update of slot s (the rule above), shared by the CPU loop and the CUDA kernel so both give
// the same bits (max_ignoring_nan is fmaxf on the device; div_rn is IEEE division on both).
FP8TRON_HD void update_delayed_slot(const ScalingBuffers& b, const DelayedUpdateParams& p, size_t s) {
  const size_t n = b.num_slots, len = b.history_len;
  float* h = b.history + s;  // h[row * n]
  const float now = h[0];
  float amax = 0.0f;
  if (now != 0.0f) {
    // Roll: row i takes row i+1, the last row takes the current amax, row 0 is cleared.
    for (size_t i = 0; i < len; ++i) {
      const float a = i + 1 < len ? h[(i + 1) * n] : now;
      amax = max_ignoring_nan(amax, a);
      h[i * n] = i > 0 ? a : 0.0f;
    }
  }
  if (p.algo == AmaxComputeAlgo::kMostRecent) amax = now;
  const float scaled_max = s < p.forward_slots ? p.forward_scaled_max : p.backward_scaled_max;
  const float scale = delayed_scale(amax, scaled_max, b.scale[s]);
  b.scale[s] = scale;
  b.scale_inv[s] = div_rn(1.0f, scale);
}

// The update on host memory.
void update_delayed_scaling_cpu(const ScalingBuffers& buffers, const DelayedUpdateParams& params);
// The same update as one CUDA kernel on device memory (one thread per slot), enqueued on `stream`
// (scaling_update.cu).
void update_delayed_scaling_cuda(const ScalingBuffers& buffers, const DelayedUpdateParams& params,
                                 CUstream_st* stream);

// Host-side state owning its buffers (the CPU path, checkpoints, and tests). The GPU path keeps
// the same layout in device memory (e.g. torch tensors) and calls update_delayed_scaling_cuda;
// serialize()/deserialize() define the checkpoint layout for both.
class DelayedScalingState {
 public:
  static constexpr size_t kForwardRoles = 3;   // input, weight, output
  static constexpr size_t kBackwardRoles = 2;  // grad_output, grad_input

  DelayedScalingState(const DelayedScaling& recipe, size_t num_gemms);

  const DelayedScaling& recipe() const { return recipe_; }
  size_t num_gemms() const { return num_gemms_; }
  size_t num_slots() const { return num_gemms_ * (kForwardRoles + kBackwardRoles); }
  size_t forward_slots() const { return num_gemms_ * kForwardRoles; }
  size_t history_len() const { return static_cast<size_t>(recipe_.amax_history_len); }
  uint64_t steps() const { return steps_; }

  static size_t slot(size_t num_gemms, size_t gemm, TensorRole role);
  size_t slot(size_t gemm, TensorRole role) const { return slot(num_gemms_, gemm, role); }
  Format format(TensorRole role) const { return tensor_format(recipe_.format, role); }

  // Recording: the quantizer of a tensor max-accumulates its amax into the slot's row-0 entry.
  float* current_amaxes() { return history_.data(); }
  void record_amax(size_t slot, float amax);
  float current_amax(size_t slot) const { return history_[slot]; }

  float scale(size_t slot) const { return scale_[slot]; }
  float scale_inv(size_t slot) const { return scale_inv_[slot]; }
  // history entry `row` (0 = current step, len-1 = most recent completed step) of a slot.
  float history(size_t row, size_t slot) const { return history_[row * num_slots() + slot]; }

  // End of a training step (after the backward pass and before the next forward). Counts the step;
  // on every `interval`-th step reduces the amaxes (when `reduce` is set and the recipe reduces),
  // rolls the histories and recomputes the scales. Returns whether scales were updated.
  bool step(const AmaxReduceFn& reduce = nullptr);

  ScalingBuffers buffers();

  // Checkpoint layout (a flat float vector):
  //   [0] tag 1.0 (layout version), [1] num forward slots, [2] num backward slots, [3] history_len,
  //   [4] steps mod 2^20, [5] steps / 2^20, then history (history_len * num_slots), scale, scale_inv.
  std::vector<float> serialize() const;
  // Restores a serialized state. The slot counts must match (UserError otherwise). A different
  // history length is accepted: the current row and the most recent completed steps are kept.
  void deserialize(const std::vector<float>& flat);

 private:
  DelayedScaling recipe_;
  size_t num_gemms_;
  uint64_t steps_ = 0;
  std::vector<float> history_;
  std::vector<float> scale_;
  std::vector<float> scale_inv_;
};

}  // namespace fp8tron::fp8
