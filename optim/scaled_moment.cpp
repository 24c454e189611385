#include "optim/scaled_moment.h"

#include "core/error.h"

namespace fp8tron {
namespace {
// The largest value a stored element takes: TE keeps fp16 states at half of fp16's range and FP8
// states at E4M3's.
constexpr double kFp16Range = 65504.0 / 2.0;
constexpr double kFp8Range = 448.0;
}  // namespace

ScaledMoment::ScaledMoment(StateDtype dtype, int64_t numel, std::vector<std::pair<int64_t, int64_t>> pieces,
                           const torch::TensorOptions& device)
    : dtype_(dtype), pieces_(std::move(pieces)) {
  FP8TRON_CHECK(scaled(dtype), "ScaledMoment stores fp16 or fp8 states");
  int64_t end = 0;
  for (auto [offset, n] : pieces_) {
    FP8TRON_CHECK(offset >= end && n > 0 && offset + n <= numel, "scaled-moment pieces must be ascending and inside");
    end = offset + n;
  }
  stored_ = torch::zeros({numel}, device.dtype(dtype == StateDtype::Fp16 ? torch::kFloat16 : torch::kFloat8_e4m3fn));
  factors_ = torch::ones({int64_t(pieces_.size())}, device.dtype(torch::kFloat32));
  amaxes_ = torch::zeros({int64_t(pieces_.size())}, device.dtype(torch::kFloat32));
}

torch::Tensor ScaledMoment::unscaled(size_t i) const {
  const auto [offset, n] = pieces_.at(i);
  return stored_.narrow(0, offset, n).to(torch::kFloat32).mul_(factors_[int64_t(i)]);
}

void ScaledMoment::store(size_t i, const torch::Tensor& values, const torch::Tensor& skip) {
  const auto [offset, n] = pieces_.at(i);
  FP8TRON_CHECK(values.scalar_type() == torch::kFloat32 && values.numel() == n, "a scaled moment stores fp32 pieces");
  torch::NoGradGuard no_grad;
  // Every step below is a device operation on 0-dim tensors (no host synchronisation), each the
  // same IEEE operation TE performs: a division by a range held as a tensor (not a scalar, which
  // CUDA would turn into a multiplication by its reciprocal) and reciprocals.
  const auto [min, max] = torch::aminmax(values);
  torch::Tensor amax = torch::maximum(-min, max);
  const bool fp16 = dtype_ == StateDtype::Fp16;
  const torch::Tensor scale = amax / torch::full({}, fp16 ? kFp16Range : kFp8Range, amax.options());
  const torch::Tensor zero = torch::zeros({}, amax.options());
  const torch::Tensor positive = scale > 0;
  const torch::Tensor multiplier = torch::where(positive, scale.reciprocal(), zero);
  torch::Tensor codes, factor;
  if (fp16) {
    codes = (values * multiplier).to(torch::kFloat16);
    factor = scale;
  } else {
    codes = (values * multiplier).clamp_(-kFp8Range, kFp8Range).to(torch::kFloat8_e4m3fn);  // saturating, as TE's cast
    factor = torch::where(positive, multiplier.reciprocal(), zero);
  }
  torch::Tensor target = stored_.narrow(0, offset, n), old_factor = factors_[int64_t(i)], old_amax = amaxes_[int64_t(i)];
  if (skip.defined()) {
    // Selected as bit patterns: torch selects no FP8 values.
    const torch::Tensor keep = skip.to(target.device()) != 0;
    const auto bits = fp16 ? torch::kInt16 : torch::kUInt8;
    codes = torch::where(keep, target.view(bits), codes.view(bits)).view(target.scalar_type());
    factor = torch::where(keep, old_factor, factor);
    amax = torch::where(keep, old_amax, amax);
  }
  target.copy_(codes);
  old_factor.copy_(factor);
  old_amax.copy_(amax);
}

torch::Tensor ScaledMoment::checkpoint_values(size_t i) const {
  torch::Tensor values = unscaled(i);
  const torch::Tensor magnitude = values.abs();
  const torch::Tensor top = magnitude == magnitude.max();
  return torch::where(top, values.sign() * amaxes_[int64_t(i)], values);
}

torch::Tensor ScaledMoment::unscaled_copy(const torch::Device& device) const {
  torch::NoGradGuard no_grad;
  auto out = torch::zeros({stored_.numel()}, torch::TensorOptions().dtype(torch::kFloat32).device(device));
  for (size_t i = 0; i < pieces_.size(); ++i)
    out.narrow(0, pieces_[i].first, pieces_[i].second).copy_(checkpoint_values(i));
  return out;
}

void ScaledMoment::store_all(const torch::Tensor& values) {
  FP8TRON_CHECK(values.numel() == stored_.numel(), "store_all takes the whole moment");
  for (size_t i = 0; i < pieces_.size(); ++i) {
    const auto [offset, n] = pieces_[i];
    store(i, values.narrow(0, offset, n).to(stored_.device(), torch::kFloat32));
  }
}

}  // namespace fp8tron
