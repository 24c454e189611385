// Transformer Engine's FusedAdam._apply_scale written out, for tests of the precision-aware
// optimizer's fp16/fp8 moments (optim/scaled_state.h): amax from aminmax, a scale divided by the
// range held as a tensor, fp16 multiplied by the scale's reciprocal (0 for a zero scale), FP8 by
// the quantizer's 1 / scale with a saturating cast. On the tensor's own device.
#pragma once
#include <torch/torch.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "core/config/training_config.h"
#include "optim/optimizer_domain.h"

namespace fp8tron {

inline torch::Tensor te_stored(const torch::Tensor& v, StateDtype dtype) {
  const auto [min, max] = torch::aminmax(v);
  const auto amax = torch::maximum(-min, max);
  const bool fp16 = dtype == StateDtype::Fp16;
  const auto range = torch::full({1}, fp16 ? 65504.0f / 2.0f : 448.0f, v.options());
  const auto scale = torch::div(amax, range);
  if (fp16) return (v * torch::where(scale > 0, scale.reciprocal(), torch::zeros({1}, v.options()))).to(torch::kFloat16);
  return (v * (1 / scale)).clamp(-448, 448).to(torch::kFloat8_e4m3fn);
}

// Each parameter's part inside this rank's shard of a moment (laid out from shard_begin()), with
// the parameter's name.
inline std::vector<std::pair<std::string, torch::Tensor>> per_param(const OptimizerDomain& d, const torch::Tensor& moment) {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  const int64_t begin = d.shard_begin(), end = d.shard_begin() + d.shard_numel();
  for (const auto& slot : d.param_slots()) {
    const int64_t lo = std::max(slot.offset, begin), hi = std::min(slot.offset + slot.numel, end);
    if (lo < hi) out.emplace_back(slot.name, moment.narrow(0, lo - begin, hi - lo));
  }
  return out;
}

}  // namespace fp8tron
