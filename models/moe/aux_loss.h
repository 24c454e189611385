// The router's auxiliary losses and how they reach the gradients (Megatron-Core's
// switch_load_balancing_loss_func, z_loss_func, compute_routing_scores_for_aux_loss and
// MoEAuxLossAutoScaler). The losses are never added to the lm loss: each is attached to an
// activation by an identity node whose backward also starts a backward from the loss, seeded with
// the context's aux_grad_scale (the factors the lm loss gets: loss scale / micro-batches).
#pragma once
#include <torch/torch.h>

#include "core/config/moe_config.h"

namespace fp8tron {
class MoeContext;

namespace moe {

// The scores the balancing losses use, recomputed from the logits (fp32): softmax over all
// experts, or sigmoid / sqrt(softplus) normalised per token; and their plain top-k map (no
// expert bias, no group limit, no capacity).
struct AuxScores {
  torch::Tensor scores;  // [T, E], differentiable
  torch::Tensor map;     // [T, E] bool
  torch::Tensor counts;  // [E] fp32: the map's column sums, when already known (else undefined)
};
AuxScores aux_loss_scores(const torch::Tensor& logits, int64_t topk, MoeScoreFunction score_function);

// coeff * E / (k * total_tokens^2) * sum_e (sum_t scores[t, e]) * tokens_per_expert[e]: this
// rank's partial of the Switch-Transformer loss when the counts and total_tokens span the
// scope (micro-batch over tp x cp, a sequence, or the global batch). Equals coeff at perfectly
// balanced counts.
torch::Tensor switch_load_balancing_loss(const torch::Tensor& scores, const torch::Tensor& tokens_per_expert,
                                         double total_tokens, int64_t topk, int64_t num_experts, double coeff);

// coeff * mean_t(logsumexp_e(logits)^2).
torch::Tensor z_loss(const torch::Tensor& logits, double coeff);

// Returns `activation` unchanged; in backward its gradient passes through and `loss` gets
// context.aux_grad_scale() as its gradient (read when the backward runs).
torch::Tensor attach_aux_loss(const torch::Tensor& activation, const torch::Tensor& loss, const MoeContext& context);

}  // namespace moe
}  // namespace fp8tron
