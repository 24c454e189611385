#include "models/modules.h"

namespace fp8tron {

NormOptions NormOptions::from(const ModelConfig& m, int64_t size) {
  return NormOptions{size, m.normalization, m.norm_epsilon, m.apply_layernorm_1p};
}

namespace {
torch::Tensor norm_weight_init(const NormOptions& o) {
  return o.zero_centered_gamma ? torch::zeros({o.size}) : torch::ones({o.size});
}
}  // namespace

torch::Tensor apply_norm(const torch::Tensor& x, const NormOptions& o, const torch::Tensor& weight,
                         const torch::Tensor& bias) {
  const torch::Tensor gamma = o.zero_centered_gamma ? weight + 1 : weight;
  if (o.kind == Normalization::RMSNorm) return at::rms_norm(x, {o.size}, gamma, o.epsilon);
  return at::layer_norm(x, {o.size}, gamma, bias, o.epsilon);
}

TELayerNormImpl::TELayerNormImpl(const NormOptions& o) : options(o) {
  weight = register_parameter("weight", norm_weight_init(o));
  if (o.kind == Normalization::LayerNorm) bias = register_parameter("bias", torch::zeros({o.size}));
}
torch::Tensor TELayerNormImpl::forward(const torch::Tensor& x) { return apply_norm(x, options, weight, bias); }

namespace {
torch::Tensor normal_weight(int64_t out, int64_t in, double std) { return torch::randn({out, in}) * std; }
}  // namespace

TELinearImpl::TELinearImpl(const LinearOptions& o) : options(o) {
  weight = register_parameter("weight", normal_weight(o.out_features, o.in_features, o.init_std));
  if (o.bias) bias = register_parameter("bias", torch::zeros({o.out_features}));
}
torch::Tensor TELinearImpl::forward(const torch::Tensor& x) { return torch::nn::functional::linear(x, weight, bias); }

TELayerNormLinearImpl::TELayerNormLinearImpl(const NormOptions& n, const LinearOptions& l)
    : norm_options(n), linear_options(l) {
  layer_norm_weight = register_parameter("layer_norm_weight", norm_weight_init(n));
  if (n.kind == Normalization::LayerNorm) layer_norm_bias = register_parameter("layer_norm_bias", torch::zeros({n.size}));
  weight = register_parameter("weight", normal_weight(l.out_features, l.in_features, l.init_std));
  if (l.bias) bias = register_parameter("bias", torch::zeros({l.out_features}));
}
torch::Tensor TELayerNormLinearImpl::forward(const torch::Tensor& x) {
  return torch::nn::functional::linear(apply_norm(x, norm_options, layer_norm_weight, layer_norm_bias), weight, bias);
}

RotaryEmbedding::RotaryEmbedding(int64_t head_dim, double percent, double base)
    : rotary_dim_(int64_t(double(head_dim) * percent)), base_(base) {}

torch::Tensor RotaryEmbedding::apply(const torch::Tensor& x) const {
  const int64_t s = x.size(1);
  if (!cos_.defined() || cos_.size(0) < s || cos_.device() != x.device() || cos_.scalar_type() != x.scalar_type()) {
    // Tables in fp32 first, then cast: inv_freq = base^(-2i/dim), angles = position x inv_freq.
    auto opts = torch::TensorOptions().dtype(torch::kFloat32).device(x.device());
    auto inv_freq = 1.0 / torch::pow(base_, torch::arange(0, rotary_dim_, 2, opts) / double(rotary_dim_));
    auto angles = torch::outer(torch::arange(s, opts), inv_freq);
    auto emb = torch::cat({angles, angles}, -1);  // [s, rotary_dim]
    cos_ = emb.cos().to(x.scalar_type()).view({1, s, 1, rotary_dim_});
    sin_ = emb.sin().to(x.scalar_type()).view({1, s, 1, rotary_dim_});
  }
  auto cos = cos_.narrow(1, 0, s), sin = sin_.narrow(1, 0, s);
  auto rot = x.narrow(-1, 0, rotary_dim_);
  auto half = rotary_dim_ / 2;
  auto rotated_half = torch::cat({-rot.narrow(-1, half, half), rot.narrow(-1, 0, half)}, -1);
  auto out = rot * cos + rotated_half * sin;
  if (rotary_dim_ == x.size(-1)) return out;
  return torch::cat({out, x.narrow(-1, rotary_dim_, x.size(-1) - rotary_dim_)}, -1);
}

}  // namespace fp8tron
