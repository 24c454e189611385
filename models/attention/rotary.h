// Rotary position embeddings as Megatron-Core applies them (rotary_pos_embedding.py,
// yarn_rotary_pos_embedding.py, rope_utils.py), on [s, b, heads, d] tensors:
//  - frequencies inv_freq_i = base^(-2i/dim) in fp32, optionally rescaled by Llama 3.1's rule
//    (--use-rope-scaling) or YaRN's interpolation (--position-embedding-type yarn, MLA);
//  - angle = position x inv_freq; the first `dim` channels are rotated, the rest pass through;
//  - layouts: rotate-half (Llama; channel i pairs with i + dim/2), interleaved (RoFormer;
//    channels 2i and 2i+1 pair, --rotary-interleaved), or MLA's (channels de-interleaved first,
//    even ones then odd ones, then rotate-half: the output stays de-interleaved);
//  - YaRN multiplies cos and sin by its concentration factor (mscale ratio).
#pragma once
#include <torch/torch.h>

#include "core/config/model_variants.h"

namespace fp8tron {

enum class RotaryLayout { RotateHalf, Interleaved, MlaDeinterleave };
enum class RotaryScaling { None, Llama3, Yarn };

struct RotarySpec {
  int64_t dim = 0;  // rotated channels per head (even)
  double base = 10000;
  RotaryScaling scaling = RotaryScaling::None;
  double llama3_factor = 8.0;
  YarnConfig yarn;
  RotaryLayout layout = RotaryLayout::RotateHalf;
  bool fused = true;  // one CUDA kernel each way on the GPU (models/attention/rotary_kernels.h)
};

// Megatron's _yarn_get_mscale: 1 for scale <= 1, else 0.1 m ln(scale) + 1.
double yarn_mscale(double scale, double m);
// The factor on cos and sin: mscale(s, mscale) / mscale(s, mscale_all_dim) for YaRN, else 1.
double rotary_concentration(const RotarySpec& spec);
// inv_freq [dim / 2], fp32 on the CPU, with the spec's scaling.
torch::Tensor rotary_inv_freq(const RotarySpec& spec);

class RotaryEmbedding {
 public:
  RotaryEmbedding() = default;
  // `positions` [s] (CPU int64): the sequence positions of x's tokens when they are not 0..s-1
  // (a context-parallel shard).
  explicit RotaryEmbedding(RotarySpec spec, torch::Tensor positions = {});
  // Rotates x [s, b, heads, d] (d >= dim) by its positions (0..s-1 unless given). x may also be
  // [s, b, groups, per_group, d] (the query part of a fused QKV projection): the result is then
  // [s, b, groups * per_group, d], and the fused kernel reads x in place, with no copy.
  torch::Tensor apply(const torch::Tensor& x) const;
  bool enabled() const { return spec_.dim > 0; }

 private:
  // The chain of tensor ops (the CPU path, and --no-rope-fusion) on x [s, b, heads, d].
  torch::Tensor apply_unfused(const torch::Tensor& x) const;
  bool fused_kernel_applies(const torch::Tensor& x) const;
  // angle = position x inv_freq, [s, dim / 2] fp32 on `device`.
  torch::Tensor position_angles(int64_t s, const torch::Device& device) const;
  // The fp32 tables [s, dim / 2] of the fused kernel (scaled by the concentration factor).
  std::pair<torch::Tensor, torch::Tensor> angle_tables(int64_t s, const torch::Device& device) const;

  RotarySpec spec_;
  torch::Tensor positions_;
  mutable torch::Tensor cos_, sin_;  // cached per (device, dtype, length)
  mutable torch::Tensor angle_cos_, angle_sin_;  // the fused kernel's, cached per (device, length)
};

}  // namespace fp8tron
