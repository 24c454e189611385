#include "models/attention/rotary.h"

#include <c10/cuda/CUDAStream.h>

#include "core/error.h"
#include "models/kernel_float_of.h"
#include "models/attention/rotary_kernels.h"

#include <algorithm>
#include <cmath>

namespace fp8tron {
namespace {

// Megatron's _apply_scaling (Llama 3.1): low/high frequency factors 1 and 4, original context 8192.
torch::Tensor llama3_scaled(const torch::Tensor& freqs, double factor) {
  const double old_context = 8192, low_freq_factor = 1, high_freq_factor = 4;
  const double low_freq_wavelen = old_context / low_freq_factor, high_freq_wavelen = old_context / high_freq_factor;
  auto wavelen = 2 * M_PI / freqs;
  auto llama = torch::where(wavelen > low_freq_wavelen, freqs / factor, freqs);
  auto smooth = (old_context / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
  auto smoothed = (1 - smooth) * llama / factor + smooth * llama;
  auto medium = (wavelen < high_freq_wavelen).logical_not().logical_and((wavelen > low_freq_wavelen).logical_not());
  return torch::where(medium, smoothed, llama);
}

// YaRN's correction dimension for `rotations` full turns over the original context.
double correction_dim(double rotations, int64_t dim, double base, double original) {
  return double(dim) * std::log(original / (rotations * 2 * M_PI)) / (2 * std::log(base));
}

torch::Tensor yarn_inv_freq(const RotarySpec& s) {
  const YarnConfig& y = s.yarn;
  auto exponents = torch::arange(0, s.dim, 2, torch::kFloat32) / double(s.dim);
  auto extra = 1.0 / torch::pow(s.base, exponents);
  auto inter = 1.0 / (y.scaling_factor * torch::pow(s.base, exponents));
  double low = correction_dim(y.beta_fast, s.dim, s.base, double(y.original_max_position_embeddings));
  double high = correction_dim(y.beta_slow, s.dim, s.base, double(y.original_max_position_embeddings));
  if (y.correction_range_round_to_int) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, double(s.dim - 1));
  if (low == high) high += 0.001;  // as Megatron: no division by zero
  auto ramp = ((torch::arange(s.dim / 2, torch::kFloat32) - low) / (high - low)).clamp(0, 1);
  auto mask = 1.0 - ramp;  // 1 keeps the original (extrapolated) frequency
  return inter * (1 - mask) + extra * mask;
}

// x [s, b, heads, d] or [s, b, groups, per_group, d] (strided, last dimension contiguous) ->
// contiguous [s, b, heads, d], through one kernel; `sin_sign` -1 rotates back (the backward).
torch::Tensor rotary_kernel(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin, int64_t dim,
                            bool interleaved, float sin_sign) {
  auto x5 = x.dim() == 5 ? x : x.unsqueeze(3);
  kernels::RotaryShape shape{x5.size(0), x5.size(1), x5.size(2), x5.size(3), x5.size(4), dim,
                             {x5.stride(0), x5.stride(1), x5.stride(2), x5.stride(3)}, interleaved};
  auto out = torch::empty({shape.s, shape.b, shape.g * shape.p, shape.d}, x.options());
  const auto stream = c10::cuda::getCurrentCUDAStream(x.device().index()).stream();
  kernels::rotary_apply(x5.data_ptr(), out.data_ptr(), *kernel_float_of(x), shape, cos.data_ptr<float>(), sin.data_ptr<float>(),
                        sin_sign, stream);
  return out;
}

// The rotation is orthogonal: its gradient is the inverse rotation of the output's gradient, so
// nothing of the input is saved.
struct FusedRotary : torch::autograd::Function<FusedRotary> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& cos,
                               const torch::Tensor& sin, int64_t dim, bool interleaved) {
    ctx->save_for_backward({cos, sin});
    ctx->saved_data["dim"] = dim;
    ctx->saved_data["interleaved"] = interleaved;
    ctx->saved_data["shape"] = x.sizes().vec();
    return rotary_kernel(x, cos, sin, dim, interleaved, 1.0f);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad) {
    auto saved = ctx->get_saved_variables();
    auto g = grad[0].stride(-1) == 1 ? grad[0] : grad[0].contiguous();
    auto dx = rotary_kernel(g, saved[0], saved[1], ctx->saved_data["dim"].toInt(), ctx->saved_data["interleaved"].toBool(),
                            -1.0f);
    return {dx.view(ctx->saved_data["shape"].toIntVector()), {}, {}, {}, {}};
  }
};
}  // namespace

double yarn_mscale(double scale, double m) { return scale <= 1 ? 1.0 : 0.1 * m * std::log(scale) + 1.0; }

double rotary_concentration(const RotarySpec& s) {
  if (s.scaling != RotaryScaling::Yarn) return 1.0;
  return yarn_mscale(s.yarn.scaling_factor, s.yarn.mscale) / yarn_mscale(s.yarn.scaling_factor, s.yarn.mscale_all_dim);
}

torch::Tensor rotary_inv_freq(const RotarySpec& s) {
  if (s.scaling == RotaryScaling::Yarn) return yarn_inv_freq(s);
  auto inv_freq = 1.0 / torch::pow(s.base, torch::arange(0, s.dim, 2, torch::kFloat32) / double(s.dim));
  return s.scaling == RotaryScaling::Llama3 ? llama3_scaled(inv_freq, s.llama3_factor) : inv_freq;
}

RotaryEmbedding::RotaryEmbedding(RotarySpec spec, torch::Tensor positions)
    : spec_(std::move(spec)), positions_(std::move(positions)) {}

torch::Tensor RotaryEmbedding::apply(const torch::Tensor& x) const {
  if (fused_kernel_applies(x)) {
    auto [cos, sin] = angle_tables(x.size(0), x.device());
    return FusedRotary::apply(x, cos, sin, spec_.dim, spec_.layout == RotaryLayout::Interleaved);
  }
  if (x.dim() == 5) return apply_unfused(x.reshape({x.size(0), x.size(1), x.size(2) * x.size(3), x.size(4)}));
  return apply_unfused(x);
}

bool RotaryEmbedding::fused_kernel_applies(const torch::Tensor& x) const {
  return spec_.fused && x.is_cuda() && spec_.layout != RotaryLayout::MlaDeinterleave && x.stride(-1) == 1 &&
         kernel_float_of(x).has_value();
}

torch::Tensor RotaryEmbedding::position_angles(int64_t s, const torch::Device& device) const {
  auto inv_freq = rotary_inv_freq(spec_).to(device);
  FP8TRON_CHECK(!positions_.defined() || positions_.size(0) == s, "rotary embedding: one position per token");
  const auto positions = positions_.defined() ? positions_.to(inv_freq.options()) : torch::arange(s, inv_freq.options());
  return torch::outer(positions, inv_freq);  // [s, dim/2], fp32
}

std::pair<torch::Tensor, torch::Tensor> RotaryEmbedding::angle_tables(int64_t s, const torch::Device& device) const {
  if (!angle_cos_.defined() || angle_cos_.size(0) != s || angle_cos_.device() != device) {
    auto angles = position_angles(s, device);
    const double c = rotary_concentration(spec_);
    angle_cos_ = (angles.cos() * c).contiguous();
    angle_sin_ = (angles.sin() * c).contiguous();
  }
  return {angle_cos_, angle_sin_};
}

torch::Tensor RotaryEmbedding::apply_unfused(const torch::Tensor& x) const {
  const int64_t s = x.size(0), dim = spec_.dim, half = dim / 2;
  if (!cos_.defined() || cos_.size(0) < s || cos_.device() != x.device() || cos_.scalar_type() != x.scalar_type()) {
    // Tables in fp32, then scaled and cast: angle = position x inv_freq.
    auto angles = position_angles(s, x.device());
    auto emb = spec_.layout == RotaryLayout::Interleaved ? angles.unsqueeze(-1).expand({s, half, 2}).reshape({s, dim})
                                                         : torch::cat({angles, angles}, -1);
    const double c = rotary_concentration(spec_);
    cos_ = (emb.cos() * c).to(x.scalar_type()).view({s, 1, 1, dim});
    sin_ = (emb.sin() * c).to(x.scalar_type()).view({s, 1, 1, dim});
  }
  auto cos = cos_.narrow(0, 0, s), sin = sin_.narrow(0, 0, s);
  auto rot = x.narrow(-1, 0, dim);
  if (spec_.layout == RotaryLayout::MlaDeinterleave) {
    // Even channels first, then odd ones (Megatron's mla_rotary_interleaved).
    auto pairs = rot.unflatten(-1, {half, 2});
    rot = torch::cat({pairs.select(-1, 0), pairs.select(-1, 1)}, -1);
  }
  torch::Tensor rotated;
  if (spec_.layout == RotaryLayout::Interleaved) {
    auto pairs = rot.unflatten(-1, {half, 2});  // (x0, x1) -> (-x1, x0)
    rotated = torch::stack({-pairs.select(-1, 1), pairs.select(-1, 0)}, -1).flatten(-2);
  } else {
    rotated = torch::cat({-rot.narrow(-1, half, half), rot.narrow(-1, 0, half)}, -1);
  }
  auto out = rot * cos + rotated * sin;
  if (dim == x.size(-1)) return out;
  return torch::cat({out, x.narrow(-1, dim, x.size(-1) - dim)}, -1);
}

}  // namespace fp8tron
