#include "fp8/scaling_state.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/text.h"
#include "fp8/scale_math.h"

namespace fp8tron::fp8 {

namespace {

constexpr float kLayoutTag = 1.0f;
constexpr size_t kHeader = 6;
constexpr uint64_t kStepSplit = uint64_t{1} << 20;

}  // namespace

DelayedUpdateParams delayed_update_params(const DelayedScaling& recipe, size_t num_gemms) {
  DelayedUpdateParams p;
  p.forward_slots = num_gemms * DelayedScalingState::kForwardRoles;
  const float margin_factor = std::ldexp(1.0f, -recipe.margin);
  p.forward_scaled_max = max_finite(tensor_format(recipe.format, TensorRole::kInput)) * margin_factor;
  p.backward_scaled_max = max_finite(tensor_format(recipe.format, TensorRole::kGradOutput)) * margin_factor;
  p.algo = recipe.amax_compute_algo;
  p.slot_begin = 0;
  p.slot_end = num_gemms * (DelayedScalingState::kForwardRoles + DelayedScalingState::kBackwardRoles);
  return p;
}

void update_delayed_scaling_cpu(const ScalingBuffers& b, const DelayedUpdateParams& p) {
  FP8TRON_CHECK(p.slot_end <= b.num_slots && p.slot_begin <= p.slot_end, "slot range out of bounds");
  FP8TRON_CHECK(b.history_len >= 1, "empty amax history");
  for (size_t s = p.slot_begin; s < p.slot_end; ++s) update_delayed_slot(b, p, s);
}

DelayedScalingState::DelayedScalingState(const DelayedScaling& recipe, size_t num_gemms)
    : recipe_(recipe), num_gemms_(num_gemms) {
  validate(Recipe(recipe));
  history_.assign(history_len() * num_slots(), 0.0f);
  scale_.assign(num_slots(), 1.0f);
  scale_inv_.assign(num_slots(), 1.0f);
}

size_t DelayedScalingState::slot(size_t num_gemms, size_t gemm, TensorRole role) {
  FP8TRON_CHECK(gemm < num_gemms, strprintf("GEMM %zu out of %zu", gemm, num_gemms));
  switch (role) {
    case TensorRole::kInput: return gemm * kForwardRoles + 0;
    case TensorRole::kWeight: return gemm * kForwardRoles + 1;
    case TensorRole::kOutput: return gemm * kForwardRoles + 2;
    case TensorRole::kGradOutput: return num_gemms * kForwardRoles + gemm * kBackwardRoles + 0;
    case TensorRole::kGradInput: return num_gemms * kForwardRoles + gemm * kBackwardRoles + 1;
  }
  return 0;
}

void DelayedScalingState::record_amax(size_t slot, float amax) {
  FP8TRON_CHECK(slot < num_slots(), "slot out of range");
  history_[slot] = max_ignoring_nan(history_[slot], amax);
}

ScalingBuffers DelayedScalingState::buffers() {
  return {history_.data(), scale_.data(), scale_inv_.data(), history_len(), num_slots()};
}

bool DelayedScalingState::step(const AmaxReduceFn& reduce) {
  ++steps_;
  if (steps_ % static_cast<uint64_t>(recipe_.interval) != 0) return false;
  if (reduce && recipe_.reduce_amax) reduce(current_amaxes(), num_slots());
  update_delayed_scaling_cpu(buffers(), delayed_update_params(recipe_, num_gemms_));
  return true;
}

std::vector<float> DelayedScalingState::serialize() const {
  std::vector<float> flat;
  flat.reserve(kHeader + history_.size() + 2 * num_slots());
  flat.push_back(kLayoutTag);
  flat.push_back(static_cast<float>(forward_slots()));
  flat.push_back(static_cast<float>(num_slots() - forward_slots()));
  flat.push_back(static_cast<float>(history_len()));
  flat.push_back(static_cast<float>(steps_ % kStepSplit));
  flat.push_back(static_cast<float>(steps_ / kStepSplit));
  flat.insert(flat.end(), history_.begin(), history_.end());
  flat.insert(flat.end(), scale_.begin(), scale_.end());
  flat.insert(flat.end(), scale_inv_.begin(), scale_inv_.end());
  return flat;
}

void DelayedScalingState::deserialize(const std::vector<float>& flat) {
  if (flat.size() < kHeader || flat[0] != kLayoutTag) {
    throw UserError("checkpoint: FP8 scaling state has an unknown layout (expected version 1)");
  }
  const auto fwd = static_cast<size_t>(flat[1]), bwd = static_cast<size_t>(flat[2]);
  const auto len = static_cast<size_t>(flat[3]);
  if (fwd != forward_slots() || bwd != num_slots() - forward_slots()) {
    throw UserError(strprintf("checkpoint: FP8 scaling state covers %zu FP8 GEMMs, this model has %zu",
                              fwd / kForwardRoles, num_gemms_));
  }
  const size_t n = num_slots();
  if (len < 1 || flat.size() != kHeader + len * n + 2 * n) {
    throw UserError(strprintf("checkpoint: FP8 scaling state has %zu values, expected %zu for history length %zu",
                              flat.size(), kHeader + len * n + 2 * n, len));
  }
  steps_ = static_cast<uint64_t>(flat[4]) + static_cast<uint64_t>(flat[5]) * kStepSplit;
  const float* saved = flat.data() + kHeader;
  std::fill(history_.begin(), history_.end(), 0.0f);
  std::copy(saved, saved + n, history_.begin());  // row 0: the amax being recorded
  const size_t keep = std::min(len, history_len()) - 1;
  for (size_t t = 0; t < keep; ++t) {  // most recent completed steps, newest first
    std::copy(saved + (len - 1 - t) * n, saved + (len - t) * n, history_.begin() + (history_len() - 1 - t) * n);
  }
  std::copy(saved + len * n, saved + len * n + n, scale_.begin());
  std::copy(saved + len * n + n, saved + len * n + 2 * n, scale_inv_.begin());
}

}  // namespace fp8tron::fp8
