#include "models/moe/router.h"

#include "core/error.h"
#include "models/init_methods.h"
#include "models/moe/aux_loss.h"
#include "models/moe/fused_topk_routing.h"
#include "models/recompute/recompute.h"

namespace fp8tron {
namespace {
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

torch::Dtype router_dtype(MoeRouterDtype d, torch::Dtype input) {
  return d == MoeRouterDtype::kFp32 ? torch::kFloat32 : d == MoeRouterDtype::kFp64 ? torch::kFloat64 : input;
}

// Megatron's RouterGatingLinearFunction: logits = x W^T (+ b) computed in the router dtype while
// saving the (bf16) input and weight, not their fp32/fp64 copies; gradients return in the
// input's and the weight's dtypes. (Two nodes: autograd inputs must be defined tensors.)
torch::Tensor gating_forward(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias, torch::Dtype d) {
  auto out = torch::mm(x.to(d), weight.to(d).t());
  return bias.defined() ? out + bias.to(d) : out;
}
variable_list gating_backward(AutogradContext* ctx, const torch::Tensor& grad) {
  const auto saved = ctx->get_saved_variables();
  const auto& x = saved[0];
  const auto& weight = saved[1];
  const auto d = torch::Dtype(ctx->saved_data["dtype"].toInt());
  auto g = grad.to(d);
  variable_list out = {torch::mm(g, weight.to(d)).to(x.scalar_type()), torch::mm(g.t(), x.to(d)).to(weight.scalar_type())};
  if (saved.size() > 2) out.push_back(g.sum(0).to(saved[2].scalar_type()));
  out.push_back({});  // the dtype argument
  return out;
}
struct RouterGating : torch::autograd::Function<RouterGating> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& weight, int64_t dtype) {
    ctx->save_for_backward({x, weight});
    ctx->saved_data["dtype"] = dtype;
    return gating_forward(x, weight, {}, torch::Dtype(dtype));
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) { return gating_backward(ctx, grad[0]); }
};
struct RouterGatingWithBias : torch::autograd::Function<RouterGatingWithBias> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& weight,
                               const torch::Tensor& bias, int64_t dtype) {
    ctx->save_for_backward({x, weight, bias});
    ctx->saved_data["dtype"] = dtype;
    return gating_forward(x, weight, bias, torch::Dtype(dtype));
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) { return gating_backward(ctx, grad[0]); }
};

const char* metric_name(MoeBalancing type) {
  switch (type) {
    case MoeBalancing::kAuxLoss: return "load_balancing_loss";
    case MoeBalancing::kSeqAuxLoss: return "seq_load_balancing_loss";
    case MoeBalancing::kGlobalAuxLoss: return "global_load_balancing_loss";
    default: return "";
  }
}
}  // namespace

TopKRouterImpl::TopKRouterImpl(const ModelConfig& m, const std::string& prefix, int64_t layer, const ModuleFactory& f,
                               std::shared_ptr<MoeContext> context)
    : config_(m.moe), layer_(layer), context_(std::move(context)) {
  const int64_t experts = m.moe.num_experts;
  // Replicated over tensor-parallel ranks; under SP each rank routes its own sequence shard, so
  // the gradients are partial sums (Megatron sets sequence_parallel on them).
  ParamInfo w;
  w.global_shape = {experts, m.hidden_size};
  w.reduce_grad_over_tp = f.tp().sequence_parallel && f.tp().size > 1;
  weight = add_param("weight", f.normal(prefix + ".weight", w, hidden_init_std(m)), w);
  if (m.add_bias_linear) {
    ParamInfo b = w;
    b.global_shape = {experts};
    bias = add_param("bias", f.normal(prefix + ".bias", b, hidden_init_std(m)), b);  // Megatron: init_method, not zeros
  }
  if (config_.enable_expert_bias) expert_bias = register_buffer("expert_bias", torch::zeros({experts}, torch::kFloat32));
  context_->register_router(this);
}

torch::Tensor TopKRouterImpl::gating(const torch::Tensor& x2d) const {
  const auto dtype = router_dtype(config_.router_dtype, x2d.scalar_type());
  return bias.defined() ? RouterGatingWithBias::apply(x2d, weight, bias, int64_t(dtype))
                        : RouterGating::apply(x2d, weight, int64_t(dtype));
}

torch::Tensor TopKRouterImpl::counts_over(const torch::Tensor& map, Communicator& group, const torch::Tensor& known) const {
  auto counts = known.defined() ? known : map.sum(0, false, torch::kFloat32);
  if (group.size() > 1) {
    if (known.defined()) counts = counts.clone();  // reduced in place; `known` may serve another loss
    group.all_reduce(counts);
  }
  return counts;
}

torch::Tensor TopKRouterImpl::attach_z_loss(const torch::Tensor& logits) {
  // Each tensor-parallel rank averages over its own sequence shard and the router gradient is
  // summed over the group: the coefficient is divided by its size.
  const auto& groups = context_->groups();
  const double coeff = *config_.z_loss_coeff / double(groups.tp_cp->size());
  auto z = moe::z_loss(logits, coeff);
  context_->record("z_loss", layer_, z.detach() / coeff, MetricGroup::kNone, MetricGroup::kTpDpCp, true);
  return moe::attach_aux_loss(logits, z, *context_);
}

// Megatron's _apply_aux_loss / _apply_seq_aux_loss / _apply_global_aux_loss, in that order.
torch::Tensor TopKRouterImpl::attach_balancing_losses(torch::Tensor probs, const torch::Tensor& logits, int64_t seq,
                                                      int64_t batch, const std::optional<moe::AuxScores>& fused_aux) {
  bool any = false;
  for (const auto& t : config_.balancing) any = any || (metric_name(t.type)[0] != '\0' && t.coeff > 0);
  if (!any) return probs;
  const auto& groups = context_->groups();
  const int64_t k = config_.topk, experts = config_.num_experts, tokens = logits.size(0);
  const auto aux = fused_aux ? *fused_aux : moe::aux_loss_scores(logits, k, config_.score_function);
  auto attach = [&](MoeBalancing type, const torch::Tensor& loss, double coeff, MetricGroup reduce, bool dp_average) {
    context_->record(metric_name(type), layer_, loss.detach() / coeff, reduce, MetricGroup::kNone, dp_average);
    probs = moe::attach_aux_loss(probs, loss, *context_);
  };
  for (MoeBalancing type : {MoeBalancing::kAuxLoss, MoeBalancing::kSeqAuxLoss, MoeBalancing::kGlobalAuxLoss}) {
    double coeff = 0;
    for (const auto& t : config_.balancing)
      if (t.type == type) coeff = t.coeff;
    if (coeff <= 0) continue;
    if (type == MoeBalancing::kAuxLoss) {
      const double total = double(tokens * groups.tp_cp->size());
      auto counts = counts_over(aux.map, *groups.tp_cp, aux.counts);
      attach(type, moe::switch_load_balancing_loss(aux.scores, counts, total, k, experts, coeff), coeff, MetricGroup::kTpCp,
             true);
    } else if (type == MoeBalancing::kSeqAuxLoss) {
      // Per sequence: token t = s * B + b, so [S, B * E] puts sequence b's expert e in column
      // b * E + e; the loss over that matrix is the sum of the per-sequence losses.
      const double total = double(seq * groups.tp_cp->size());
      auto scores = aux.scores.reshape({seq, batch * experts});
      auto counts = counts_over(aux.map.reshape({seq, batch * experts}), *groups.tp_cp);
      auto loss = moe::switch_load_balancing_loss(scores, counts, total, k, experts, coeff) / double(batch);
      attach(type, loss, coeff, MetricGroup::kTpCp, true);
    } else {
      // Counts of the global batch so far: this micro-batch's over tp x dp x cp, averaged with
      // the step's earlier micro-batches.
      const double total = double(tokens * groups.tp_dp_cp->size());
      auto counts = counts_over(aux.map, *groups.tp_dp_cp, aux.counts);
      if (!global_tokens_per_expert_.defined()) global_tokens_per_expert_ = torch::zeros_like(counts);
      global_tokens_per_expert_ += counts;
      ++global_aux_micro_batches_;
      auto average = global_tokens_per_expert_ / double(global_aux_micro_batches_);
      attach(type, moe::switch_load_balancing_loss(aux.scores, average, total, k, experts, coeff), coeff,
             MetricGroup::kTpDpCp, false);
    }
  }
  return probs;
}

moe::Routing TopKRouterImpl::forward(const torch::Tensor& x) {
  FP8TRON_CHECK(x.dim() == 3, "the router takes [sequence, batch, hidden]");
  const int64_t seq = x.size(0), batch = x.size(1);
  auto input = x.reshape({seq * batch, x.size(2)});
  // Multiplicative noise from the default generator (as Megatron; dropout's stream).
  if (config_.input_jitter_eps) input = moe::input_jitter(input, *config_.input_jitter_eps);
  auto logits = gating(input);
  if (config_.force_load_balancing) logits = moe::random_logits(logits);
  // The auxiliary losses, their logged values and the expert-bias counts belong to the pass the
  // gradients flow through: under recomputation, the replay (models/recompute/recompute.h).
  const bool gradient_pass = torch::GradMode::is_enabled() && !recompute_first_pass_active();
  const bool training = is_training() && gradient_pass;
  if (training && config_.z_loss_coeff) logits = attach_z_loss(logits);
  const bool sinkhorn = config_.balancing.size() == 1 && config_.balancing[0].type == MoeBalancing::kSinkhorn;
  const auto options = moe::TopKOptions::from(config_);
  moe::Routing r;
  std::optional<moe::AuxScores> fused_aux;
  if (sinkhorn) {
    r = moe::sinkhorn_routing(logits, config_.topk, is_training());
  } else if (moe::fused_routing_applies(logits, options)) {
    auto fused = moe::fused_topk_softmax(logits, options);
    r = fused.routing;
    fused_aux = fused.aux;
  } else {
    r = moe::topk_routing(logits, options, expert_bias);
  }
  if (config_.capacity_factor)
    r = moe::apply_capacity(r, config_.topk, *config_.capacity_factor, config_.drop_policy, config_.pad_to_capacity);
  if (training) r.probs = attach_balancing_losses(r.probs, logits, seq, batch, fused_aux);
  if (expert_bias.defined() && gradient_pass) {
    torch::NoGradGuard no_grad;
    auto counts = r.map.sum(0, false, torch::kFloat32);
    if (!local_tokens_per_expert_.defined()) local_tokens_per_expert_ = torch::zeros_like(counts);
    local_tokens_per_expert_ += counts;
  }
  return r;
}

void TopKRouterImpl::update_expert_bias(const torch::Tensor& summed_counts) {
  torch::NoGradGuard no_grad;
  // Under-loaded experts (below the mean count) move up by the rate, over-loaded ones down.
  auto mean = summed_counts.sum() / double(summed_counts.numel());
  expert_bias.add_(torch::sign(mean - summed_counts) * config_.bias_update_rate);
}

void TopKRouterImpl::reset_step_statistics() {
  if (local_tokens_per_expert_.defined()) local_tokens_per_expert_.zero_();
  if (global_tokens_per_expert_.defined()) global_tokens_per_expert_.zero_();
  global_aux_micro_batches_ = 0;
}

}  // namespace fp8tron
