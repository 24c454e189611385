// Building blocks with Transformer Engine's module names and parameter names, so state dicts
// read like Megatron-Core's TE layer spec (e.g. linear_qkv.layer_norm_weight, linear_qkv.weight).
// In this issue they compute in the parameter dtype (bf16/fp16/fp32); the FP8 engine and the
// tensor-parallel split slot in behind the same modules.
#pragma once
#include <torch/torch.h>

#include "trainer/config.h"

namespace fp8tron {

// Normalization options shared by every norm of a model.
struct NormOptions {
  int64_t size = 0;
  Normalization kind = Normalization::LayerNorm;
  double epsilon = 1e-5;
  bool zero_centered_gamma = false;  // --apply-layernorm-1p: weight stores gamma - 1
  static NormOptions from(const ModelConfig& m, int64_t size);
};

// y = norm(x) with weight (and bias for LayerNorm) given; shared by TELayerNorm and the fused
// norm+linear module.
torch::Tensor apply_norm(const torch::Tensor& x, const NormOptions& o, const torch::Tensor& weight,
                         const torch::Tensor& bias);

// TELayerNorm: LayerNorm or RMSNorm by configuration.
class TELayerNormImpl : public torch::nn::Module {
 public:
  explicit TELayerNormImpl(const NormOptions& options);
  torch::Tensor forward(const torch::Tensor& x);
  NormOptions options;
  torch::Tensor weight, bias;  // bias undefined for RMSNorm
};
TORCH_MODULE(TELayerNorm);

struct LinearOptions {
  int64_t in_features = 0;
  int64_t out_features = 0;
  bool bias = true;
  double init_std = 0.02;
};

// TELinear: y = x W^T + b. (Column/row-parallel variants arrive with tensor parallelism.)
class TELinearImpl : public torch::nn::Module {
 public:
  explicit TELinearImpl(const LinearOptions& options);
  torch::Tensor forward(const torch::Tensor& x);
  LinearOptions options;
  torch::Tensor weight, bias;
};
TORCH_MODULE(TELinear);

// TELayerNormLinear: y = norm(x) W^T + b, the fused module in front of QKV and FC1.
class TELayerNormLinearImpl : public torch::nn::Module {
 public:
  TELayerNormLinearImpl(const NormOptions& norm, const LinearOptions& linear);
  torch::Tensor forward(const torch::Tensor& x);
  NormOptions norm_options;
  LinearOptions linear_options;
  torch::Tensor layer_norm_weight, layer_norm_bias, weight, bias;
};
TORCH_MODULE(TELayerNormLinear);

// Rotary position embedding (Megatron's non-interleaved "rotate half" form) on the first
// rotary_dim channels of each head; x is [b, s, heads, d].
class RotaryEmbedding {
 public:
  RotaryEmbedding() = default;
  RotaryEmbedding(int64_t head_dim, double percent, double base);
  torch::Tensor apply(const torch::Tensor& x) const;
  int64_t rotary_dim() const { return rotary_dim_; }

 private:
  int64_t rotary_dim_ = 0;
  double base_ = 10000;
  // cos/sin tables cached per (device, dtype, length).
  mutable torch::Tensor cos_, sin_;
};

}  // namespace fp8tron
