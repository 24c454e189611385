// GPT in Megatron-Core's structure and parameter names:
//   embedding.{word,position}_embeddings.weight
//   decoder.layers.N.self_attention.{linear_qkv (norm fused), q_layernorm, k_layernorm, linear_proj}
//   decoder.layers.N.mlp.{linear_fc1 (norm fused), linear_fc2}
//   decoder.final_layernorm, output_layer (untied only)
// Activations are [batch, seq, hidden]. The QKV projection uses Megatron's grouped layout: per
// query group, its query heads, then one key and one value head.
#pragma once
#include <torch/torch.h>

#include "models/modules.h"
#include "trainer/config.h"

namespace fp8tron {

class SelfAttentionImpl : public torch::nn::Module {
 public:
  explicit SelfAttentionImpl(const ModelConfig& m);
  torch::Tensor forward(const torch::Tensor& x);  // norm + attention + output projection

  TELayerNormLinear linear_qkv{nullptr};
  TELayerNorm q_layernorm{nullptr}, k_layernorm{nullptr};
  TELinear linear_proj{nullptr};

 private:
  ModelConfig config_;
  RotaryEmbedding rope_;
};
TORCH_MODULE(SelfAttention);

class MlpImpl : public torch::nn::Module {
 public:
  explicit MlpImpl(const ModelConfig& m);
  torch::Tensor forward(const torch::Tensor& x);  // norm + fc1 + GeLU/SwiGLU + fc2

  TELayerNormLinear linear_fc1{nullptr};
  TELinear linear_fc2{nullptr};

 private:
  bool swiglu_;
};
TORCH_MODULE(Mlp);

class TransformerLayerImpl : public torch::nn::Module {
 public:
  explicit TransformerLayerImpl(const ModelConfig& m);
  torch::Tensor forward(const torch::Tensor& x);

  SelfAttention self_attention{nullptr};
  Mlp mlp{nullptr};

 private:
  double hidden_dropout_;
};
TORCH_MODULE(TransformerLayer);

class GptModelImpl : public torch::nn::Module {
 public:
  explicit GptModelImpl(const ModelConfig& m);
  // tokens [b, s] (int64) -> logits [b, s, padded_vocab] in the parameter dtype.
  torch::Tensor forward(const torch::Tensor& tokens);
  // Mean cross entropy (in fp32) over positions where loss_mask is 1.
  torch::Tensor loss(const torch::Tensor& tokens, const torch::Tensor& labels, const torch::Tensor& loss_mask);

  const ModelConfig& config() const { return config_; }

 private:
  ModelConfig config_;
  torch::nn::Module* embedding_ = nullptr;
  torch::Tensor word_embeddings_, position_embeddings_;
  torch::nn::ModuleList layers_{nullptr};
  TELayerNorm final_layernorm_{nullptr};
  TELinear output_layer_{nullptr};
};
TORCH_MODULE(GptModel);

// Which fused attention backend ATen picks for these shapes (logged once at start).
std::string attention_backend_name(const ModelConfig& m, int64_t micro_batch, torch::Device device, torch::Dtype dtype);

// Prefers cuDNN attention on GPU (1.9x the flash path on H200, TARGETS.md), flash as fallback.
void configure_attention_backends();

}  // namespace fp8tron
