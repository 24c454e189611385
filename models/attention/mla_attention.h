// Multi-latent attention (DeepSeek-V2/V3; Megatron-Core's MLASelfAttention with the Transformer
// Engine spec and its state-dict names), tensor- and sequence-parallel, FP8-capable:
//   c_q = x W_q_down^T          linear_q_down_proj   [q_lora, H]       replicated (TE "duplicated")
//   q   = norm(c_q) W_q_up^T    linear_q_up_proj     [n (dn+dr), q_lora] heads split over TP
//      (no --q-lora-rank: q = x W_q^T, linear_q_proj [n (dn+dr), H])
//   c   = x W_kv_down^T         linear_kv_down_proj  [kv_lora + dr, H]  replicated
//   kv  = norm(c_kv) W_kv_up^T  linear_kv_up_proj    [n (dn+dv), kv_lora] heads split
//   out = attn(q, k, v) W_o^T   linear_proj          [H, n dv]          columns split
// The q/kv norms exist only with --qk-layernorm (fused into the up projections, as TE's
// LayerNormColumnParallelLinear: `layer_norm_weight`). Per head, q = [q_nope (dn) | q_pe (dr)],
// k = [k_nope (dn) | k_pe (dr)] with k_pe (from c) shared by all heads, v (dv). RoPE (plain or
// YaRN, MLA's default) rotates q_pe and k_pe after de-interleaving their channels. The softmax
// scale is mscale(s, --mscale-all-dim)^2 / sqrt(dn + dr).
// Tensor parallelism: the replicated down projections see the whole sequence without sequence
// parallelism; k_pe then enters the tensor-parallel region through copy_to_tp so that its
// gradient (each rank's heads contribute) is summed over the group — Megatron leaves that sum
// out, which makes k_pe's rows of linear_kv_down_proj drift apart between ranks. With sequence
// parallelism k_pe is all-gathered (reduce-scattered in backward) and the down projections'
// gradients are partial per rank (summed over TP by the optimizer).
// Context parallelism: the rotary part takes the shard's global positions, and the attention runs
// through the context-parallel attention of the layer's --cp-comm-type, whose key/value blocks
// carry the query/key head size dn + dr and the value head size dv separately.
#pragma once
#include <torch/torch.h>

#include <memory>

#include "models/attention/rotary.h"
#include "models/linear/modules.h"
#include "parallel/context_parallel.h"

namespace fp8tron {
class ActivationOffloader;

// A linear layer whose weight every tensor-parallel rank holds whole (TE's parallel_mode
// "duplicated"): y = x W^T on this rank's input (a sequence shard under SP).
class TEDuplicatedLinearImpl : public ShardedModule {
 public:
  TEDuplicatedLinearImpl(const LinearOptions& options, const ModuleFactory& factory);
  torch::Tensor forward(const torch::Tensor& x);
  LinearOptions options;
  torch::Tensor weight;
  std::shared_ptr<fp8::Fp8Site> fp8_site;

 private:
  MainGradsPtr main_grads_;  // --delay-wgrad-compute: its queue holds the weight gradient
};
TORCH_MODULE(TEDuplicatedLinear);

// The rotary embedding of multi-latent attention (qk_pos_emb_head_dim channels).
RotarySpec mla_rotary(const ModelConfig& m);
// The softmax scale of multi-latent attention.
double mla_softmax_scale(const ModelConfig& m);

class MlaSelfAttentionImpl : public torch::nn::Module {
 public:
  MlaSelfAttentionImpl(const ModelConfig& m, const std::string& prefix, const ModuleFactory& factory);
  // x: the input-normed hidden states [s(/tp), b, H]; attention_mask as SelfAttention's.
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& attention_mask);

  TEDuplicatedLinear linear_q_down_proj{nullptr}, linear_kv_down_proj{nullptr};
  // Plain column-parallel linears, or with --qk-layernorm the norm-fused ones.
  std::shared_ptr<torch::nn::Module> linear_q_proj, linear_q_up_proj, linear_kv_up_proj;
  TERowParallelLinear linear_proj{nullptr};

 private:
  torch::Tensor project(const std::shared_ptr<torch::nn::Module>& linear, const torch::Tensor& x);
  // The up projections and the rotary embedding: {query, key, value} [s, b, heads, d] from the
  // query input (q's down projection, or x), the compressed kv and the rotary key part.
  std::vector<torch::Tensor> up_project(const std::vector<torch::Tensor>& compressed);
  // softmax(QK^T)V of the heads, [s, b, heads * v_head_dim].
  torch::Tensor core_attention(const torch::Tensor& query, const torch::Tensor& key, const torch::Tensor& value,
                               const torch::Tensor& attention_mask);
  // Causal (or masked) attention of [s, b, heads, d] query/key and [s, b, heads, dv] value: the
  // context-parallel attention when CP > 1. Returns [s, b, heads, dv].
  torch::Tensor attention_kernel(const torch::Tensor& query, const torch::Tensor& key, const torch::Tensor& value,
                                 const torch::Tensor& attention_mask, double dropout) const;
  // core_attention, recomputed in backward with --recompute-modules core_attn.
  torch::Tensor attend(const std::vector<torch::Tensor>& qkv, const torch::Tensor& attention_mask);

  ModelConfig config_;
  TensorParallelContext tp_;
  ContextParallelContext cp_;
  CpCommType cp_comm_type_ = CpCommType::P2P;
  int64_t local_heads_;
  RotaryEmbedding rope_;
  double softmax_scale_;
  bool recompute_up_proj_;  // --recompute-modules mla_up_proj (models/recompute/output_discarding_recompute.h)
  bool recompute_core_;     // --recompute-modules core_attn (models/recompute/recompute.h)
  // --offload-modules core_attn / attn_proj (models/recompute/activation_offload.h); null: kept.
  ActivationOffloader* offload_core_ = nullptr;
  ActivationOffloader* offload_proj_ = nullptr;
};
TORCH_MODULE(MlaSelfAttention);

}  // namespace fp8tron
