#include "models/gpt_model.h"

#include <ATen/SDPBackend.h>

#include <cmath>

namespace fp8tron {
namespace {
namespace F = torch::nn::functional;

// Megatron scales the output projections of each residual branch by 1/sqrt(2 * num_layers).
double output_std(const ModelConfig& m) { return m.init_method_std / std::sqrt(2.0 * double(m.num_layers)); }

torch::Tensor maybe_dropout(const torch::Tensor& x, double p, bool training) {
  return p > 0 && training ? F::dropout(x, F::DropoutFuncOptions().p(p).training(true)) : x;
}
}  // namespace

// ---- attention -----------------------------------------------------------------------------------
SelfAttentionImpl::SelfAttentionImpl(const ModelConfig& m) : config_(m) {
  const int64_t q = m.num_attention_heads * m.kv_channels, kv = m.num_query_groups * m.kv_channels;
  linear_qkv = register_module(
      "linear_qkv", TELayerNormLinear(NormOptions::from(m, m.hidden_size),
                                      LinearOptions{m.hidden_size, q + 2 * kv, m.add_qkv_bias, m.init_method_std}));
  if (m.qk_layernorm) {
    q_layernorm = register_module("q_layernorm", TELayerNorm(NormOptions::from(m, m.kv_channels)));
    k_layernorm = register_module("k_layernorm", TELayerNorm(NormOptions::from(m, m.kv_channels)));
  }
  linear_proj = register_module("linear_proj", TELinear(LinearOptions{q, m.hidden_size, m.add_bias_linear, output_std(m)}));
  if (m.position_embedding == PositionEmbedding::Rope) rope_ = RotaryEmbedding(m.kv_channels, m.rotary_percent, m.rotary_base);
}

torch::Tensor SelfAttentionImpl::forward(const torch::Tensor& x) {
  const auto& m = config_;
  const int64_t b = x.size(0), s = x.size(1), d = m.kv_channels;
  const int64_t groups = m.num_query_groups, per_group = m.num_attention_heads / groups;
  auto qkv = linear_qkv(x).view({b, s, groups, per_group + 2, d});
  auto q = qkv.narrow(3, 0, per_group).reshape({b, s, m.num_attention_heads, d});
  auto k = qkv.select(3, per_group);      // [b, s, groups, d]
  auto v = qkv.select(3, per_group + 1);
  if (m.qk_layernorm) {
    q = q_layernorm(q);
    k = k_layernorm(k);
  }
  if (m.position_embedding == PositionEmbedding::Rope) {
    q = rope_.apply(q);
    k = rope_.apply(k);
  }
  // SDPA wants [b, heads, s, d]. Grouped keys/values are repeated per query head so every
  // backend (cuDNN included) takes them.
  q = q.transpose(1, 2);
  k = k.transpose(1, 2);
  v = v.transpose(1, 2);
  if (per_group > 1) {
    k = k.repeat_interleave(per_group, 1);
    v = v.repeat_interleave(per_group, 1);
  }
  const double p = is_training() ? m.attention_dropout : 0.0;
  auto out = at::scaled_dot_product_attention(q, k, v, {}, p, /*is_causal=*/true);
  out = out.transpose(1, 2).reshape({b, s, m.num_attention_heads * d});
  return linear_proj(out);
}

// ---- MLP -------------------------------------------------------------------------------------------
MlpImpl::MlpImpl(const ModelConfig& m) : swiglu_(m.swiglu) {
  const int64_t fc1_out = m.swiglu ? 2 * m.ffn_hidden_size : m.ffn_hidden_size;
  linear_fc1 = register_module(
      "linear_fc1", TELayerNormLinear(NormOptions::from(m, m.hidden_size),
                                      LinearOptions{m.hidden_size, fc1_out, m.add_bias_linear, m.init_method_std}));
  linear_fc2 = register_module(
      "linear_fc2", TELinear(LinearOptions{m.ffn_hidden_size, m.hidden_size, m.add_bias_linear, output_std(m)}));
}

torch::Tensor MlpImpl::forward(const torch::Tensor& x) {
  auto h = linear_fc1(x);
  if (swiglu_) {
    auto halves = h.chunk(2, -1);
    h = F::silu(halves[0]) * halves[1];
  } else {
    h = at::gelu(h, "tanh");  // Megatron's fused bias-GeLU and TE use the tanh approximation
  }
  return linear_fc2(h);
}

// ---- layer -------------------------------------------------------------------------------------------
TransformerLayerImpl::TransformerLayerImpl(const ModelConfig& m) : hidden_dropout_(m.hidden_dropout) {
  self_attention = register_module("self_attention", SelfAttention(m));
  mlp = register_module("mlp", Mlp(m));
}

torch::Tensor TransformerLayerImpl::forward(const torch::Tensor& x) {
  auto h = x + maybe_dropout(self_attention(x), hidden_dropout_, is_training());
  return h + maybe_dropout(mlp(h), hidden_dropout_, is_training());
}

// ---- model -------------------------------------------------------------------------------------------
GptModelImpl::GptModelImpl(const ModelConfig& m) : config_(m) {
  auto embedding = register_module("embedding", std::make_shared<torch::nn::Module>("LanguageModelEmbedding"));
  embedding_ = embedding.get();
  word_embeddings_ = torch::randn({m.padded_vocab_size, m.hidden_size}) * m.init_method_std;
  auto word = embedding->register_module("word_embeddings", std::make_shared<torch::nn::Module>("Embedding"));
  word_embeddings_ = word->register_parameter("weight", word_embeddings_);
  if (m.position_embedding == PositionEmbedding::LearnedAbsolute) {
    auto pos = embedding->register_module("position_embeddings", std::make_shared<torch::nn::Module>("Embedding"));
    position_embeddings_ =
        pos->register_parameter("weight", torch::randn({m.max_position_embeddings, m.hidden_size}) * m.init_method_std);
  }
  auto decoder = register_module("decoder", std::make_shared<torch::nn::Module>("TransformerBlock"));
  layers_ = decoder->register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < m.num_layers; ++i) layers_->push_back(TransformerLayer(m));
  final_layernorm_ = decoder->register_module("final_layernorm", TELayerNorm(NormOptions::from(m, m.hidden_size)));
  if (m.untie_embeddings_and_output_weights)
    output_layer_ = register_module(
        "output_layer", TELinear(LinearOptions{m.hidden_size, m.padded_vocab_size, false, m.init_method_std}));
}

torch::Tensor GptModelImpl::forward(const torch::Tensor& tokens) {
  const int64_t s = tokens.size(1);
  auto h = F::embedding(tokens, word_embeddings_);
  if (position_embeddings_.defined()) h = h + position_embeddings_.narrow(0, 0, s);
  h = maybe_dropout(h, config_.hidden_dropout, is_training());
  for (const auto& layer : *layers_) h = layer->as<TransformerLayer>()->forward(h);
  h = final_layernorm_(h);
  return F::linear(h, output_layer_ ? output_layer_->weight : word_embeddings_);
}

torch::Tensor GptModelImpl::loss(const torch::Tensor& tokens, const torch::Tensor& labels, const torch::Tensor& loss_mask) {
  auto logits = forward(tokens);
  auto per_token = F::cross_entropy(logits.view({-1, logits.size(-1)}).to(torch::kFloat32), labels.reshape({-1}),
                                    F::CrossEntropyFuncOptions().reduction(torch::kNone));
  auto mask = loss_mask.reshape({-1}).to(torch::kFloat32);
  return (per_token * mask).sum() / mask.sum().clamp_min(1.0);
}

void configure_attention_backends() {
  at::globalContext().setSDPPriorityOrder({int64_t(at::SDPBackend::cudnn_attention), int64_t(at::SDPBackend::flash_attention),
                                           int64_t(at::SDPBackend::efficient_attention), int64_t(at::SDPBackend::math)});
  at::globalContext().setSDPUseCuDNN(true);
}

std::string attention_backend_name(const ModelConfig& m, int64_t micro_batch, torch::Device device, torch::Dtype dtype) {
  auto opts = torch::TensorOptions().device(device).dtype(dtype);
  auto q = torch::empty({micro_batch, m.num_attention_heads, m.seq_length, m.kv_channels}, opts);
  const double p = m.attention_dropout;
  switch (at::SDPBackend(at::_fused_sdp_choice(q, q, q, {}, p, true))) {
    case at::SDPBackend::cudnn_attention: return "cuDNN fused attention";
    case at::SDPBackend::flash_attention: return "flash attention";
    case at::SDPBackend::efficient_attention: return "memory-efficient attention";
    case at::SDPBackend::math: return "math (unfused) attention";
    default: return "unknown attention backend";
  }
}

}  // namespace fp8tron
