// Quantized torch tensors: what the FP8 autograd nodes (fp8_linear.h, fp8_grouped_linear.h) save
// and hand to their GEMMs, and the quantizers that make them on each of the three paths:
//   native     GPU, FP8 tensor cores: the quantize kernels, the codes feed cuBLASLt
//   emulated   GPU, MXFP8 on Hopper and HiF8: the same kernels, then dequantized to bf16 copies
//   cpu        the reference quantizers (quantize_reference.h), dequantized to fp32 copies
// All of them are in quantized_tensor.cpp: the per-tensor quantizers (quantize, quantized_weight)
// and the grouped one.
#pragma once
#include <torch/torch.h>

#include <memory>
#include <vector>

#include "fp8/fp8_linear.h"
#include "fp8/quantize.h"
#include "fp8/segments.h"

namespace fp8tron::fp8 {

enum class Path { kNative, kEmulated, kCpu };
Path path_of(const Fp8Engine& e);
CudaStream current_stream(const torch::Device& device);

// A quantized 2-D tensor: the view the kernels and GEMMs take, the torch tensors that own its
// memory, and on the emulated and CPU paths the dequantized copies the high-precision GEMMs use.
struct Quantized {
  Fp8TensorView view;
  torch::Tensor data, data_t, scale, scale_inv, scale_inv_t, amax;
  torch::Tensor dequantized, dequantized_t;  // [rows, cols] and [cols, rows]
};

// Allocates the scale factors a copy needs: one fp32 for tensor scaling (shared by both copies),
// the block grid of fp8_tensor.h otherwise (E8M0 bytes for MXFP8).
torch::Tensor scale_storage(const ScaleLayout& layout, const torch::Device& device);

// Quantizes x2d [rows, cols] for `role` of `site`: the row-wise copy and/or the transposed copy.
// `record_amax`: delayed scaling max-accumulates the amax into the site's history slot.
// `reduce_current` (tensorwise scaling of a part of a larger tensor, linear_ops.h): the amax of x2d
// is replaced by the whole's before the scale is taken. `count_stats`: false for a cast made again
// from the values of one already counted (--log-fp8-stats-to-tensorboard counts each value once).
std::shared_ptr<Quantized> quantize(Fp8Engine& e, const Fp8Site& site, TensorRole role, torch::Tensor x2d,
                                    bool rowwise, bool transposed, bool record_amax, TensorCastFusion fusion = {},
                                    const AmaxReducer* reduce_current = nullptr, bool count_stats = true);

// The weight of the current optimizer step, quantized once (both copies) and shared by every
// micro-batch; re-quantized when the optimizer (or a checkpoint load) changed it.
std::shared_ptr<Quantized> quantized_weight(Fp8Site& site, const torch::Tensor& weight, bool record_amax);
// Whether the site's weight comes from codes gathered this step (--fp8-param-gather) rather than
// from casting its parameter.
bool weight_from_gathered_codes(const Fp8Site& site);

// A quantized grouped tensor (segments.h): segment e belongs to sites[e], whose scaling state it
// uses (its own delayed-scaling slots, current or block scales).
struct QuantizedSegments {
  SegmentLayout layout;
  SegmentedFp8View view;
  torch::Tensor data, data_t, scale, scale_inv, scale_inv_t, amax;
  // Emulated / CPU: the dequantized row-wise copy [total_padded, cols] and the transposed copies
  // (flat, segment e's [cols, padded_e] at element cols * row_begin_e).
  torch::Tensor dequantized, dequantized_t;

  Fp8TensorView segment(size_t e) const { return segment_view(view, layout, e); }
  torch::Tensor dequantized_rows(size_t e) const;  // [padded_e, cols]
  torch::Tensor dequantized_cols(size_t e) const;  // [cols, padded_e]
};

// Quantizes x2d [sum of rows, cols] (segment e: rows[e] rows, padded to the recipe's
// fp8_token_alignment) for `role` in one pass. The sites must have been registered one after the
// other (consecutive delayed-scaling slots: one strided pointer serves them all). column_sums:
// per-tensor recipes on the GPU, a zeroed fp32 [segments, cols] that receives each segment's
// column sums.
// The SwiGLU prologues, fused into the cast where grouped_swiglu_cast_fuses(e, role) and the
// transposed copy is requested, applied first elsewhere:
//   kSwiglu          x2d is [sum of rows, 2 cols], SwiGLU fc1 outputs; quantizes silu(gate) * up
//                    (torch's ops where not fused)
//   kSwigluBackward  x2d is [sum of rows, cols / 2], the gradient of the SwiGLU's output, and
//                    swiglu_input its input h [sum of rows, cols]; quantizes the gradient of h
//                    (fp8::swiglu_backward where not fused; fused needs cols % 256 == 0)
std::shared_ptr<QuantizedSegments> quantize_grouped(Fp8Engine& e, const std::vector<Fp8Site*>& sites, TensorRole role,
                                                    const torch::Tensor& x2d, const std::vector<int64_t>& rows,
                                                    bool rowwise, bool transposed, bool record_amax,
                                                    float* column_sums = nullptr, Prologue prologue = Prologue::kNone,
                                                    const torch::Tensor& swiglu_input = {});

// The emulated and CPU paths' high-precision copies of q's codes (the row-wise copy and/or the
// transposed one, whichever q holds): bf16 on the GPU, fp32 on the CPU (`cpu`).
void dequantize_copies(QuantizedSegments& q, bool cpu, CudaStream stream);

// Whether quantize_grouped fuses a SwiGLU into the cast of `role` (transposed copy requested):
// native FP8 GEMMs with delayed per-tensor scaling.
bool grouped_swiglu_cast_fuses(const Fp8Engine& e, TensorRole role);

}  // namespace fp8tron::fp8
