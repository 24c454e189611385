// The MoE metrics report (Megatron's MoEMetricsTracker.report in training_log): every iteration
// each tracked metric's per-layer values are reduced across ranks (sum over pipeline stages,
// then the metric's own group: summed over tp x cp for the aux losses, over tp x dp x cp for the
// global one, averaged over tp x dp x cp for the z-loss; then averaged over data-parallel ranks
// unless the metric says not to), scaled by 1 / micro-batches and averaged over the MoE layers.
// Metrics a rank never recorded (a stage without MoE layers, a zero coefficient) join as zeros,
// so every rank takes part in every reduction. The recorded values restart at zero.
#pragma once
#include <torch/torch.h>

#include <string>
#include <utility>
#include <vector>

#include "models/moe/moe_context.h"
#include "parallel/parallel_state.h"

namespace fp8tron {

struct MoeMetricsReport {
  std::vector<std::pair<std::string, torch::Tensor>> scalars;    // name -> 0-dim fp32 (device)
  std::vector<std::pair<std::string, torch::Tensor>> per_layer;  // name -> [num_layers], / micro-batches
};

// Every rank calls this once per iteration (collectives inside). `moe_layers`: what the layers'
// sum is divided by (logged_moe_layers in core/config/model_config.h: the MTP layers count when
// the last decoder layer is an MoE layer).
MoeMetricsReport report_moe_metrics(MoeContext& context, const ParallelState& parallel, int64_t num_micro_batches,
                                    const torch::Device& device, int64_t moe_layers);

}  // namespace fp8tron
