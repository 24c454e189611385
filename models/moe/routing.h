// The routing math of Megatron-Core's TopKRouter as pure functions on [tokens, experts] tensors
// (MoE/moe_utils.py: topk_routing_with_score_function, group_limited_topk, sinkhorn,
// apply_router_token_dropping, pad_routing_map). Tokens are rows in the router's order
// t = s * B + b of the [S, B, H] activation. Unit-tested against hand-computed values
// (tests/models/test_moe_router.cpp, docs/moe.md).
#pragma once
#include <torch/torch.h>

#include <optional>
#include <utility>

#include "core/config/moe_config.h"

namespace fp8tron::moe {

// probs [T, E]: the routing weights at the selected experts, zero elsewhere (the logits' dtype);
// map [T, E] bool: the selected experts.
struct Routing {
  torch::Tensor probs;
  torch::Tensor map;
  torch::Tensor counts;  // [E] int64 on the map's device: its column sums, when already known (else undefined)
};

struct TopKOptions {
  int64_t topk = 2;
  MoeScoreFunction score_function = MoeScoreFunction::kSoftmax;
  bool pre_softmax = false;
  std::optional<int64_t> num_groups, group_topk;
  std::optional<double> scaling_factor;
  static TopKOptions from(const MoeConfig& c);
};

// The [tokens, experts] bool map of `like`'s shape, true at each row's `indices` [tokens, k].
torch::Tensor selection_mask(const torch::Tensor& like, const torch::Tensor& indices);

// Scores and top-k selection (Megatron-Core's TopKRouter; docs/moe.md):
//   softmax             top-k of the logits, then softmax over the k selected (renormalised)
//   softmax, pre        softmax over all experts (fp32), top-k of it, not renormalised
//   sigmoid/sqrtsoftplus  s = sigmoid(l) or sqrt(softplus(l)) in fp32; select on s + expert_bias
//                       (when given), take the unbiased s, normalise over the k (k > 1)
// then the optional scaling factor. Group-limited selection when group_topk is set. Math in
// fp32, probs returned in the logits' dtype.
Routing topk_routing(const torch::Tensor& logits, const TopKOptions& options, const torch::Tensor& expert_bias = {});

// Top-k of `scores` [T, E] restricted to the group_topk groups (of E / num_groups contiguous
// experts) whose top-(topk / group_topk) scores sum highest. Returns (values, indices) [T, k].
std::pair<torch::Tensor, torch::Tensor> group_limited_topk(const torch::Tensor& scores, int64_t topk, int64_t num_groups,
                                                           int64_t group_topk);

// Sinkhorn normalisation of exp(cost) [T, E] to uniform row and column marginals.
torch::Tensor sinkhorn(const torch::Tensor& cost, double tolerance = 1e-4);
// Sinkhorn load balancing: training selects on sinkhorn(logits) (no gradient); probs are the
// sigmoid (k = 1) or softmax (k > 1) of the logits at the selected experts.
Routing sinkhorn_routing(const torch::Tensor& logits, int64_t topk, bool training);

// ceil(T * k / E * factor): the tokens each expert keeps.
int64_t expert_capacity(int64_t num_tokens, int64_t topk, int64_t num_experts, double capacity_factor);
// Token dropping (apply_router_token_dropping): each expert keeps its `capacity` tokens with the
// highest probs (kProbs) or its earliest routed tokens (kPosition; ties broken towards earlier
// tokens, where Megatron relies on the top-k kernel's tie order). Dropped slots get prob 0; the
// others are not renormalised. With pad_to_capacity every expert gets exactly `capacity` tokens:
// after its routed ones, the earliest unrouted tokens with prob 0.
Routing apply_capacity(const Routing& routing, int64_t topk, double capacity_factor, MoeDropPolicy policy,
                       bool pad_to_capacity);

// --moe-input-jitter-eps: x * U(1 - eps, 1 + eps) elementwise, drawn from the default generator
// (Megatron's rsample: gradients flow through x).
torch::Tensor input_jitter(const torch::Tensor& x, double eps);

// --moe-router-force-load-balancing (Megatron's apply_random_logits, a benchmarking aid): standard
// normal values in place of the logits, so that routing is balanced and independent of the model
// (the same in bf16 and FP8 runs); the gradient passes to the real logits unchanged (Megatron's
// straight-through RandomSTE). Drawn from the default generator, which recomputation replays
// (Megatron draws from the expert-parallel RNG tracker or a generator of its own).
torch::Tensor random_logits(const torch::Tensor& logits);

// --moe-router-padding-for-quantization: per expert, switch on the earliest unrouted tokens until
// its count is a multiple of `multiple` (their probs stay 0). Throws UserError when an expert
// would need more tokens than there are.
torch::Tensor pad_routing_map(const torch::Tensor& map, int64_t multiple);

}  // namespace fp8tron::moe
