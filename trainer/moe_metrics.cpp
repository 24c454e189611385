#include "trainer/moe_metrics.h"

namespace fp8tron {
namespace {

Communicator* group_of(MetricGroup g, const ParallelState& p) {
  switch (g) {
    case MetricGroup::kTpCp: return p.tp_cp.get();
    case MetricGroup::kTpDpCp: return p.tp_dp_cp.get();
    case MetricGroup::kNone: return nullptr;
  }
  return nullptr;
}

// How a metric is reduced, by name (what the router records it with), so that a stage without
// MoE layers, which never recorded it, reduces its zeros the same way.
MoeMetric reduction_of(const std::string& name) {
  MoeMetric m;
  if (name == "z_loss") {
    m.average = MetricGroup::kTpDpCp;
  } else if (name == "global_load_balancing_loss") {
    m.reduce = MetricGroup::kTpDpCp;
    m.dp_average = false;
  } else {
    m.reduce = MetricGroup::kTpCp;
  }
  return m;
}

void all_reduce(torch::Tensor& t, Communicator* group) {
  if (group && group->size() > 1) group->all_reduce(t);
}

}  // namespace

MoeMetricsReport report_moe_metrics(MoeContext& context, const ParallelState& p, int64_t num_micro_batches,
                                    const torch::Device& device, int64_t moe_layers) {
  torch::NoGradGuard no_grad;
  MoeMetricsReport report;
  for (const auto& name : context.tracked_metric_names()) {
    auto& recorded = context.metrics()[name];
    if (!recorded.values.defined())  // never recorded here: zeros, so the reductions line up
      recorded.values = torch::zeros({context.num_layers()}, torch::TensorOptions().device(device).dtype(torch::kFloat32));
    const MoeMetric metric = reduction_of(name);
    auto v = recorded.values.clone();
    all_reduce(v, p.pp.get());  // stages hold different layers
    all_reduce(v, group_of(metric.reduce, p));
    if (Communicator* avg = group_of(metric.average, p); avg && avg->size() > 1) {
      avg->all_reduce(v);
      v.div_(double(avg->size()));
    }
    if (metric.dp_average && p.dp->size() > 1) {
      p.dp->all_reduce(v);
      v.div_(double(p.dp->size()));
    }
    v.mul_(1.0 / double(num_micro_batches));
    report.scalars.emplace_back(name, v.sum() / double(moe_layers));
    report.per_layer.emplace_back(name, v);
    recorded.values.zero_();
  }
  return report;
}

}  // namespace fp8tron
