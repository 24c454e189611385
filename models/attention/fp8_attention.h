// FP8 core attention (--fp8-dot-product-attention, Transformer Engine's fp8_dpa): causal
// softmax(scale Q K^T) V with Q, K, V, the probabilities S and the output O in E4M3, and in the
// backward pass dO, dP (the gradient of the softmax input) and dQ, dK, dV in the recipe's gradient
// format (E5M2 under hybrid), every matrix product on FP8 tensor cores. How each tensor is scaled
// is fp8/attention_scaling.h's.
//
// Two paths with the same quantization points:
//   native     GPU: Q, K, V and dO cast by the quantize kernels, then cuDNN's fused FP8 attention
//              (fp8/cudnn_sdpa.h) reads and writes the codes; O and dQ, dK, dV are dequantized to
//              bf16 for the layers around it
//   emulated   CPU (and a GPU reference for the tests): the same casts as fake quantization
//              (values rounded to the FP8 grid and back) around fp32 products, with the explicit
//              flash-attention backward formulas
// Grouped keys and values (heads a multiple of the groups) on both paths.
#pragma once
#include <torch/torch.h>

#include <memory>

#include "fp8/fp8_engine.h"

namespace fp8tron {

class Fp8Attention {
 public:
  // `site`: the layer's slots of engine->attention(); `scale`: the softmax scale. On Hopper,
  // cuDNN's FP8 attention backward takes head dimension 128 only: another one is a UserError here,
  // when the model is built.
  Fp8Attention(std::shared_ptr<fp8::Fp8Engine> engine, std::shared_ptr<fp8::Fp8AttentionSite> site, double scale,
               int64_t head_dim, bool emulate = false);

  // q [s, b, heads, d], k and v [s, b, groups, d]; returns [s, b, heads * d] in q's dtype.
  torch::Tensor forward(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v) const;

  bool native() const { return !emulate_; }

  // The autograd node's two halves (fp8_attention.cpp).
  struct Saved;
  torch::Tensor forward_pass(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, Saved& saved) const;
  std::vector<torch::Tensor> backward_pass(const torch::Tensor& grad, const Saved& saved) const;

 private:
  torch::Tensor forward_native(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, Saved& saved) const;
  torch::Tensor forward_emulated(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                 Saved& saved) const;
  std::vector<torch::Tensor> backward_native(const torch::Tensor& grad, const Saved& saved) const;
  std::vector<torch::Tensor> backward_emulated(const torch::Tensor& grad, const Saved& saved) const;
  // Delayed scales of dQ, dK, dV, dP [4] from the site's amaxes (fp8/attention_scaling.h), and
  // whether this backward pass calibrates them instead.
  torch::Tensor scales_from(const torch::Tensor& amax) const;
  torch::Tensor gradient_scales() const;
  bool calibrating() const;
  void record_gradient_amaxes(const torch::Tensor& amaxes) const;

  std::shared_ptr<fp8::Fp8Engine> engine_;
  std::shared_ptr<fp8::Fp8AttentionSite> site_;
  double scale_ = 1;
  bool emulate_ = false;
  fp8::Format grad_format_ = fp8::Format::kE5M2;
  float grad_scaled_max_ = 57344.0f;  // fp8_max(grad format) * 2^-margin
};

struct Fp8Attention::Saved {
  // Native: the E4M3 codes ([s, b, heads or groups, d]) and their dequantization factors, the
  // softmax statistics [b, heads, s]. Emulated: the fake-quantized fp32 values [b, heads, s, d].
  torch::Tensor q, k, v, o, q_inv, k_inv, v_inv, o_inv, stats;
  int64_t s = 0, b = 0, heads = 0, groups = 0, d = 0;
  torch::ScalarType dtype = torch::kBFloat16;
};

}  // namespace fp8tron
