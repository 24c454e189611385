#include "models/moe/routing.h"

#include <cmath>
#include <limits>

#include "core/error.h"
#include "core/text.h"

namespace fp8tron::moe {
namespace {

std::pair<torch::Tensor, torch::Tensor> select_topk(const torch::Tensor& scores, const TopKOptions& o) {
  if (o.group_topk) return group_limited_topk(scores, o.topk, *o.num_groups, *o.group_topk);
  auto [values, indices] = scores.topk(o.topk, /*dim=*/1, /*largest=*/true, /*sorted=*/true);
  return {values, indices};
}

// sigmoid(l) or sqrt(softplus(l)) in fp32.
torch::Tensor elementwise_scores(const torch::Tensor& logits, MoeScoreFunction f) {
  auto l = logits.to(torch::kFloat32);
  return f == MoeScoreFunction::kSigmoid ? torch::sigmoid(l) : torch::nn::functional::softplus(l).sqrt();
}

}  // namespace

torch::Tensor selection_mask(const torch::Tensor& like, const torch::Tensor& indices) {
  return torch::zeros(like.sizes(), like.options().dtype(torch::kBool)).scatter_(1, indices, true);
}

TopKOptions TopKOptions::from(const MoeConfig& c) {
  TopKOptions o;
  o.topk = c.topk;
  o.score_function = c.score_function;
  o.pre_softmax = c.pre_softmax;
  o.num_groups = c.num_groups;
  o.group_topk = c.group_topk;
  o.scaling_factor = c.topk_scaling_factor;
  return o;
}

std::pair<torch::Tensor, torch::Tensor> group_limited_topk(const torch::Tensor& scores, int64_t topk, int64_t num_groups,
                                                           int64_t group_topk) {
  const int64_t tokens = scores.size(0), experts = scores.size(1);
  FP8TRON_CHECK(experts % num_groups == 0 && group_topk >= 1 && topk >= group_topk, "group-limited top-k sizes");
  const int64_t per_group = experts / num_groups;
  // A group's score: the sum of its top-(k / group_topk) scores.
  auto group_scores = std::get<0>(scores.view({tokens, num_groups, per_group}).topk(topk / group_topk, -1)).sum(-1);
  auto group_index = std::get<1>(group_scores.topk(group_topk, -1, true, false));
  auto group_mask = torch::zeros_like(group_scores).scatter(1, group_index, 1.0);
  auto expert_mask = group_mask.unsqueeze(-1).expand({tokens, num_groups, per_group}).reshape({tokens, experts});
  auto masked = scores.masked_fill(expert_mask == 0, -std::numeric_limits<double>::infinity());
  auto [values, indices] = masked.topk(topk, -1, true, true);
  return {values, indices};
}

Routing topk_routing(const torch::Tensor& logits, const TopKOptions& o, const torch::Tensor& expert_bias) {
  FP8TRON_CHECK(logits.dim() == 2, "topk_routing takes logits [tokens, experts]");
  torch::Tensor probs, indices;
  if (o.score_function == MoeScoreFunction::kSoftmax) {
    if (o.pre_softmax) {
      std::tie(probs, indices) = select_topk(torch::softmax(logits, -1, torch::kFloat32), o);
    } else {
      torch::Tensor selected;
      std::tie(selected, indices) = select_topk(logits, o);
      probs = torch::softmax(selected, -1, torch::kFloat32);
    }
  } else {
    auto scores = elementwise_scores(logits, o.score_function);
    if (expert_bias.defined()) {
      // The bias steers the selection only; the probs are the unbiased scores.
      indices = select_topk(scores + expert_bias.to(torch::kFloat32), o).second;
      probs = scores.gather(1, indices);
    } else {
      std::tie(probs, indices) = select_topk(scores, o);
    }
    if (o.topk > 1) probs = probs / (probs.sum(-1, true) + 1e-20);
  }
  if (o.scaling_factor && *o.scaling_factor != 0.0) probs = probs * *o.scaling_factor;
  probs = probs.to(logits.scalar_type());
  return Routing{torch::zeros_like(logits).scatter(1, indices, probs), selection_mask(logits, indices)};
}

torch::Tensor sinkhorn(const torch::Tensor& cost_in, double tolerance) {
  auto cost = torch::exp(cost_in);
  auto d0 = torch::ones({cost.size(0)}, cost.options());
  auto d1 = torch::ones({cost.size(1)}, cost.options());
  const double eps = 1e-8;
  auto d1_old = d1;
  for (double error = 1e9; error > tolerance;) {
    d0 = (1.0 / double(d0.size(0))) / ((d1 * cost).sum(1) + eps);
    d1 = (1.0 / double(d1.size(0))) / ((d0.unsqueeze(1) * cost).sum(0) + eps);
    error = (d1_old - d1).abs().mean().item<double>();
    d1_old = d1;
  }
  return d1 * cost * d0.unsqueeze(1);
}

Routing sinkhorn_routing(const torch::Tensor& logits, int64_t topk, bool training) {
  auto activation = topk == 1 ? torch::sigmoid(logits) : torch::softmax(logits, -1, torch::kFloat32).to(logits.scalar_type());
  torch::Tensor indices;
  if (training) {
    torch::NoGradGuard no_grad;
    indices = std::get<1>(sinkhorn(logits.detach().to(torch::kFloat32)).topk(topk, 1));
  } else {
    indices = std::get<1>(activation.topk(topk, 1));
  }
  auto map = selection_mask(logits, indices);
  return Routing{activation * map, map};
}

int64_t expert_capacity(int64_t num_tokens, int64_t topk, int64_t num_experts, double capacity_factor) {
  return int64_t(std::ceil(double(num_tokens * topk) / double(num_experts) * capacity_factor));
}

Routing apply_capacity(const Routing& r, int64_t topk, double capacity_factor, MoeDropPolicy policy, bool pad_to_capacity) {
  const int64_t tokens = r.probs.size(0), experts = r.probs.size(1);
  const int64_t capacity = expert_capacity(tokens, topk, experts, capacity_factor);
  torch::Tensor keep;
  if (capacity > tokens) {
    keep = torch::ones_like(r.map);
  } else {
    torch::NoGradGuard no_grad;
    // A stable descending sort down each expert's column: among equal keys the earlier token wins.
    auto key = policy == MoeDropPolicy::kProbs ? r.probs.detach() : r.map.to(torch::kInt32);
    auto order = std::get<1>(torch::sort(key, /*stable=*/true, /*dim=*/0, /*descending=*/true));
    keep = torch::zeros({tokens, experts}, r.map.options().dtype(torch::kInt32))
               .scatter(0, order.narrow(0, 0, capacity), 1)
               .to(torch::kBool);
  }
  auto map = pad_to_capacity ? keep : r.map.logical_and(keep);
  return Routing{r.probs * map, map};
}

torch::Tensor input_jitter(const torch::Tensor& x, double eps) {
  return x * torch::empty_like(x, x.options().requires_grad(false)).uniform_(1.0 - eps, 1.0 + eps);
}

torch::Tensor random_logits(const torch::Tensor& logits) {
  const auto noise = torch::randn(logits.sizes(), logits.options().requires_grad(false));
  // noise + 0 in the forward (x - x is exactly 0 for finite x), the identity in the backward.
  return noise + (logits - logits.detach());
}

torch::Tensor pad_routing_map(const torch::Tensor& map, int64_t multiple) {
  auto per_expert = map.t().to(torch::kInt64);  // [E, T]
  auto count = per_expert.sum(1, true);
  auto missing = (multiple - count.remainder(multiple)).remainder(multiple);
  auto unrouted = per_expert == 0;
  auto rank_among_unrouted = unrouted.to(torch::kInt64).cumsum(1);
  auto add = unrouted.logical_and(rank_among_unrouted <= missing);
  return map.logical_or(add.t());
}

}  // namespace fp8tron::moe
