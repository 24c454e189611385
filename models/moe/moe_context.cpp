#include "models/moe/moe_context.h"

#include "core/error.h"
#include "models/moe/router.h"
#include "parallel/parallel_state.h"

namespace fp8tron {

ExpertParallelGroups ExpertParallelGroups::single_process() {
  ExpertParallelGroups g;
  g.ep = g.expert_tp = g.expert_tp_ep = g.tp_cp = g.tp_dp_cp = make_self_communicator("moe", 0);
  return g;
}

MoeContext::MoeContext(const MoeConfig& config, int64_t num_layers, ExpertParallelGroups groups)
    : config_(config), num_layers_(num_layers), groups_(std::move(groups)) {}

void MoeContext::record(const std::string& name, int64_t layer, const torch::Tensor& value, MetricGroup reduce,
                        MetricGroup average, bool dp_average) {
  FP8TRON_CHECK(layer >= 0 && layer < num_layers_, "MoE metric of a layer outside the model");
  auto& metric = metrics_[name];
  if (!metric.values.defined()) metric.values = torch::zeros({num_layers_}, value.options().dtype(torch::kFloat32));
  metric.values[layer] += value.detach().to(torch::kFloat32);
  metric.reduce = reduce;
  metric.average = average;
  metric.dp_average = dp_average;
}

std::vector<std::string> MoeContext::tracked_metric_names() const {
  // Megatron's training_log tests `"aux_loss" in args.moe_router_load_balancing_type`: a
  // substring test when one type was given (so seq_aux_loss and global_aux_loss also report
  // load_balancing_loss, as zeros), exact membership for a list.
  std::vector<std::string> names;
  auto given = [&](const std::string& type) {
    if (!config_.balancing_is_list) return std::string(moe_balancing_name(config_.balancing[0].type)).find(type) != std::string::npos;
    for (const auto& t : config_.balancing)
      if (moe_balancing_name(t.type) == type) return true;
    return false;
  };
  if (given("aux_loss")) names.push_back("load_balancing_loss");
  if (given("seq_aux_loss")) names.push_back("seq_load_balancing_loss");
  if (given("global_aux_loss")) names.push_back("global_load_balancing_loss");
  if (config_.z_loss_coeff) names.push_back("z_loss");
  return names;
}

void MoeContext::end_step() {
  std::vector<TopKRouterImpl*> biased;
  for (auto* r : routers_) {
    if (r->expert_bias.defined()) biased.push_back(r);
  }
  if (!biased.empty()) {
    torch::NoGradGuard no_grad;
    std::vector<torch::Tensor> counts;
    for (auto* r : biased) {
      auto c = r->local_tokens_per_expert();
      counts.push_back(c.defined() ? c : torch::zeros_like(r->expert_bias));
    }
    // One all-reduce for the stage's routers: every rank of tp x dp x cp routed its own tokens.
    auto stacked = torch::stack(counts);
    if (groups_.tp_dp_cp->size() > 1) groups_.tp_dp_cp->all_reduce(stacked);
    for (size_t i = 0; i < biased.size(); ++i) biased[i]->update_expert_bias(stacked[int64_t(i)]);
  }
  for (auto* r : routers_) r->reset_step_statistics();
}

}  // namespace fp8tron
