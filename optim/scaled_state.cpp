#include "optim/scaled_state.h"

#include <algorithm>

#include "core/error.h"

namespace fp8tron {
namespace {
// The largest value a stored element takes: TE keeps fp16 states at half of fp16's range and FP8
// states at E4M3's.
constexpr double kFp16Range = 65504.0 / 2.0;
constexpr double kFp8Range = 448.0;
}  // namespace

ScaledState::ScaledState(StateDtype dtype, int64_t numel, std::vector<std::pair<int64_t, int64_t>> pieces,
                           const torch::TensorOptions& device)
    : dtype_(dtype), pieces_(std::move(pieces)) {
  FP8TRON_CHECK(scaled(dtype), "ScaledState stores fp16 or fp8 states");
  int64_t end = 0;
  for (auto [offset, n] : pieces_) {
    FP8TRON_CHECK(offset >= end && n > 0 && offset + n <= numel, "scaled-moment pieces must be ascending and inside");
    end = offset + n;
  }
  stored_ = torch::zeros({numel}, device.dtype(dtype == StateDtype::Fp16 ? torch::kFloat16 : torch::kFloat8_e4m3fn));
  factors_ = torch::ones({int64_t(pieces_.size())}, device.dtype(torch::kFloat32));
  amaxes_ = torch::zeros({int64_t(pieces_.size())}, device.dtype(torch::kFloat32));
}

std::vector<ScaledState::Group> ScaledState::groups(size_t first, size_t last, int64_t max_elements) const {
  std::vector<Group> out;
  for (size_t i = first; i < last; ++i) {
    const bool joins = !out.empty() && out.back().second == i &&
                       pieces_[i - 1].first + pieces_[i - 1].second == pieces_[i].first &&
                       numel(out.back()) + pieces_[i].second <= max_elements;
    if (joins) ++out.back().second;
    else out.emplace_back(i, i + 1);
  }
  return out;
}

int64_t ScaledState::numel(const Group& g) const {
  return pieces_[g.second - 1].first + pieces_[g.second - 1].second - pieces_[g.first].first;
}

const torch::Tensor& ScaledState::lengths(const Group& g) const {
  torch::Tensor& t = lengths_[g];
  if (!t.defined()) {
    std::vector<int64_t> sizes;
    for (size_t i = g.first; i < g.second; ++i) sizes.push_back(pieces_[i].second);
    t = torch::tensor(sizes, torch::kInt64).to(stored_.device());
  }
  return t;
}

torch::Tensor ScaledState::per_element(const Group& g, const torch::Tensor& per_piece) const {
  if (g.second == g.first + 1) return per_piece.reshape({});
  return torch::repeat_interleave(per_piece, lengths(g), 0, numel(g));  // output size given: no host wait
}

torch::Tensor ScaledState::unscaled(const Group& g) const {
  const int64_t n = g.second - g.first;
  return stored_.narrow(0, begin(g), numel(g)).to(torch::kFloat32).mul_(per_element(g, factors_.narrow(0, g.first, n)));
}

torch::Tensor ScaledState::unscaled_range(int64_t offset, int64_t numel) const {
  torch::NoGradGuard no_grad;
  auto out = torch::zeros({numel}, stored_.options().dtype(torch::kFloat32));
  const int64_t end = offset + numel;
  auto it = std::upper_bound(pieces_.begin(), pieces_.end(), offset,
                             [](int64_t at, const std::pair<int64_t, int64_t>& p) { return at < p.first + p.second; });
  for (; it != pieces_.end() && it->first < end; ++it) {
    const int64_t lo = std::max(offset, it->first), hi = std::min(end, it->first + it->second);
    const int64_t i = it - pieces_.begin();
    out.narrow(0, lo - offset, hi - lo).copy_(stored_.narrow(0, lo, hi - lo).to(torch::kFloat32).mul_(factors_[i]));
  }
  return out;
}

void ScaledState::store(const Group& g, const torch::Tensor& values, const torch::Tensor& skip) {
  FP8TRON_CHECK(values.scalar_type() == torch::kFloat32 && values.numel() == numel(g), "a scaled moment stores fp32 groups");
  torch::NoGradGuard no_grad;
  const int64_t n = int64_t(g.second - g.first);
  // Device operations only (no host synchronisation), each the IEEE operation TE performs per
  // parameter: the absolute maximum, a division by the range held as a tensor (not a scalar,
  // which CUDA would turn into a multiplication by its reciprocal), reciprocals.
  torch::Tensor amax;
  if (n == 1) {
    const auto [min, max] = torch::aminmax(values);
    amax = torch::maximum(-min, max).abs_().reshape({1});  // abs: TE's max(-0, 0) is -0 for an all-zero piece
  } else {
    amax = at::segment_reduce(values.abs(), "max", lengths(g), {}, {}, 0, /*unsafe=*/true);
  }
  const bool fp16 = dtype_ == StateDtype::Fp16;
  const torch::Tensor scale = amax / torch::full({}, fp16 ? kFp16Range : kFp8Range, amax.options());
  const torch::Tensor zero = torch::zeros({}, amax.options());
  const torch::Tensor positive = scale > 0;
  const torch::Tensor multiplier = torch::where(positive, scale.reciprocal(), zero);
  torch::Tensor codes = values * per_element(g, multiplier), factor;
  if (fp16) {
    codes = codes.to(torch::kFloat16);
    factor = scale;
  } else {
    codes = codes.clamp_(-kFp8Range, kFp8Range).to(torch::kFloat8_e4m3fn);  // saturating, as TE's cast
    factor = torch::where(positive, multiplier.reciprocal(), zero);
  }
  torch::Tensor target = stored_.narrow(0, begin(g), numel(g)), old_factor = factors_.narrow(0, g.first, n),
                old_amax = amaxes_.narrow(0, g.first, n);
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

torch::Tensor ScaledState::checkpoint_values(size_t i) const {
  torch::Tensor values = unscaled(Group{i, i + 1});
  const torch::Tensor magnitude = values.abs();
  const torch::Tensor top = magnitude == magnitude.max();
  return torch::where(top, values.sign() * amaxes_[int64_t(i)], values);
}

kernels::StateBuffers ScaledState::kernel_buffers(size_t first, size_t last) {
  FP8TRON_CHECK(stored_.is_cuda() && first < last && last <= pieces_.size(), "the fused scaled step runs on CUDA pieces");
  if (!new_amaxes_.defined()) new_amaxes_ = torch::zeros_like(amaxes_);
  new_amaxes_.narrow(0, int64_t(first), int64_t(last - first)).zero_();
  return {stored_.data_ptr(), dtype_ == StateDtype::Fp16 ? kernels::StateType::kFloat16Scaled : kernels::StateType::kFloat8E4M3Scaled,
          factors_.data_ptr<float>(), amaxes_.data_ptr<float>(), new_amaxes_.data_ptr<float>()};
}

const torch::Tensor& ScaledState::kernel_chunks(size_t first, size_t last) const {
  static_assert(sizeof(kernels::ScaledChunk) == 3 * sizeof(int64_t), "a chunk is three int64");
  constexpr int64_t kChunk = int64_t{1} << 16;
  torch::Tensor& t = chunks_[Group{first, last}];
  if (!t.defined()) {
    std::vector<int64_t> rows;
    for (size_t i = first; i < last; ++i)
      for (int64_t at = pieces_[i].first, end = at + pieces_[i].second; at < end; at += kChunk)
        rows.insert(rows.end(), {at, std::min(at + kChunk, end), int64_t(i)});
    t = torch::tensor(rows, torch::kInt64).view({-1, 3}).to(stored_.device());
  }
  return t;
}

torch::Tensor ScaledState::unscaled_copy(const torch::Device& device) const {
  torch::NoGradGuard no_grad;
  auto out = torch::zeros({stored_.numel()}, torch::TensorOptions().dtype(torch::kFloat32).device(device));
  for (size_t i = 0; i < pieces_.size(); ++i)
    out.narrow(0, pieces_[i].first, pieces_[i].second).copy_(checkpoint_values(i));
  return out;
}

void ScaledState::store_all(const torch::Tensor& values) {
  FP8TRON_CHECK(values.numel() == stored_.numel(), "store_all takes the whole moment");
  for (size_t i = 0; i < pieces_.size(); ++i) {
    const auto [offset, n] = pieces_[i];
    store(Group{i, i + 1}, values.narrow(0, offset, n).to(stored_.device(), torch::kFloat32));
  }
}

}  // namespace fp8tron
