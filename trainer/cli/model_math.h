// Closed-form figures of a GPT configuration: parameter count, training FLOPs per token
// (Megatron's formula) and a per-GPU memory estimate (weights, gradients, optimizer states, and
// activations by Korthikanti et al., "Reducing Activation Recomputation in Large Transformer
// Models", 2022). Used by --dry-run, by the throughput log and checked against the real model.
#pragma once
#include <algorithm>
#include <cstdint>

#include "core/config/config.h"

namespace fp8tron {

struct ParameterCount {
  int64_t embedding = 0;   // word (+ learned position) embeddings
  int64_t per_layer = 0;   // one (dense) transformer layer
  int64_t final_norm = 0;
  int64_t output_layer = 0;  // 0 when tied
  int64_t mtp = 0;           // multi-token prediction layers
  int64_t total = 0;
  // Mixture of experts: an MoE layer (router, all routed experts, shared expert), of which the
  // routed experts' part, and the parameters one token uses (top-k routed experts per MoE layer).
  int64_t moe_layers = 0;
  int64_t per_moe_layer = 0;
  int64_t experts_per_moe_layer = 0;
  int64_t active = 0;  // == total for a dense model
};
ParameterCount count_parameters(const ModelConfig& m);

// Forward + backward FLOPs per token (x 3 of the forward matmuls), Megatron's
// num_floating_point_operations divided by the tokens of a batch. An MoE model counts the top-k
// routed experts and the shared expert of its MoE layers (active parameters; no router, padding
// or dropped tokens), with Megatron's current transformer_flops (causal core attention halved).
double training_flops_per_token(const ModelConfig& m);

struct MemoryEstimate {
  double weights = 0, main_weights = 0, grads = 0, optimizer_states = 0;
  // optim_grads_params: `weights` is this rank's shard; the units gathered at once come on top.
  double gathered_weights = 0;
  // 16-bit gradients: the fp32 copy of the optimizer's shard of them that it steps on.
  double grad_shard = 0;
  // optim_grads and optim_grads_params over more than one rank: `grads` are the units held at once.
  bool sharded_grads = false;
  double activations_paper = 0;  // Korthikanti et al. with the stored attention scores (5as/h term)
  double activations_fused = 0;  // the same with fused attention (no stored s x s scores)
  double logits = 0;             // output-layer logits and the fp32 copy for the loss
  // Before the first step: the weights as initialised (fp32) beside the model's weight buffer and
  // the fp32 main weights, which are built from them.
  double startup = 0;
  double total() const {
    return weights + gathered_weights + main_weights + grads + grad_shard + optimizer_states + activations_fused + logits;
  }
  double peak() const { return std::max(total(), startup); }
};
// Per GPU of the most loaded (first) pipeline stage.
MemoryEstimate estimate_memory(const Config& c);

}  // namespace fp8tron
