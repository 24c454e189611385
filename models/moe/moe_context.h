// State shared by the MoE layers of a model, passed explicitly (no globals): the
// process groups the MoE code communicates over, the auxiliary-loss gradient scale, the metric
// recorder (Megatron's MoEMetricsTracker, record side) and the routers whose expert-bias
// statistics the trainer folds in after each step.
#pragma once
#include <torch/torch.h>

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/config/moe_config.h"
#include "parallel/communicator.h"

namespace fp8tron {

class TopKRouterImpl;

// The expert grid (etp-ep-edp-pp) and the dense groups the router reduces over. Every member is a
// communicator of one rank in a single process.
struct ExpertParallelGroups {
  std::shared_ptr<Communicator> ep, expert_tp, expert_tp_ep, tp_cp, tp_dp_cp;
  int ep_rank = 0, expert_tp_rank = 0;
  static ExpertParallelGroups single_process();
};

// How a metric is reduced across ranks before it is reported (MetricEntry in Megatron): sum over
// `reduce` ranks, average over `average` ranks, then (if set) average over data-parallel ranks.
enum class MetricGroup { kNone, kTpCp, kTpDpCp };
struct MoeMetric {
  torch::Tensor values;  // [num_layers] fp32: sum over micro-batches of the unscaled loss per layer
  MetricGroup reduce = MetricGroup::kNone;
  MetricGroup average = MetricGroup::kNone;
  bool dp_average = true;
};

class MoeContext {
 public:
  MoeContext(const MoeConfig& config, int64_t num_layers, ExpertParallelGroups groups);

  const MoeConfig& config() const { return config_; }
  const ExpertParallelGroups& groups() const { return groups_; }
  int64_t num_layers() const { return num_layers_; }

  // Megatron's MoEAuxLossAutoScaler.main_loss_backward_scale: the gradient the auxiliary losses
  // start their backward with, read when the backward runs. The trainer sets it before each
  // step's backward passes to the factors the lm loss gets (loss scale / (micro-batches x DP)).
  void set_aux_grad_scale(double scale) { aux_grad_scale_ = scale; }
  double aux_grad_scale() const { return aux_grad_scale_; }

  // Router forward (training only): values[layer] += value (detached, no host sync).
  void record(const std::string& name, int64_t layer, const torch::Tensor& value, MetricGroup reduce, MetricGroup average,
              bool dp_average);
  std::map<std::string, MoeMetric>& metrics() { return metrics_; }
  // Metric names reported every iteration (Megatron's track_names in training_log).
  std::vector<std::string> tracked_metric_names() const;

  // Timers around the token dispatch and combine (the trainer's --timing-log-level 2 timers;
  // forward exchanges only: the backward's run inside autograd).
  using Timer = std::function<void(const char* name, bool start)>;
  void set_timer(Timer timer) { timer_ = std::move(timer); }
  void time(const char* name, bool start) const {
    if (timer_) timer_(name, start);
  }

  // The bytes the alltoall dispatcher's forward all-to-alls handed to the other expert-parallel
  // ranks (the rows sent to each peer times the row's bytes in the dtype sent: bf16 tokens, or FP8
  // codes and scales with --moe-dispatch-fp8), summed over layers and micro-batches (replays of
  // recomputation included) until taken. The trainer reports them per iteration with the timers.
  void add_dispatch_bytes(int64_t bytes) const { dispatch_bytes_ += bytes; }
  int64_t take_dispatch_bytes() { return dispatch_bytes_.exchange(0); }

  void register_router(TopKRouterImpl* router) { routers_.push_back(router); }
  const std::vector<TopKRouterImpl*>& routers() const { return routers_; }
  // After the gradients are final and before the optimizer step (Megatron's finalize_model_grads):
  // every router's token counts of the step, summed over tp x dp x cp in one all-reduce, move
  // its expert bias by rate * sign(mean - count); the counts and the global-aux-loss
  // accumulators restart. Every rank of a stage calls this.
  void end_step();

 private:
  MoeConfig config_;
  int64_t num_layers_;
  ExpertParallelGroups groups_;
  double aux_grad_scale_ = 1.0;
  std::map<std::string, MoeMetric> metrics_;
  std::vector<TopKRouterImpl*> routers_;
  Timer timer_;
  mutable std::atomic<int64_t> dispatch_bytes_{0};
};

}  // namespace fp8tron
