// The training loop: micro-batches accumulated to the global batch through the pipeline
// schedule, tensor/sequence/data parallelism, the mixed-precision optimizer, the LR schedule,
// loss scaling, evaluation, Megatron's log lines, TensorBoard.
#pragma once
#include <torch/torch.h>

#include <map>
#include <string>
#include <vector>

#include "parallel/parallel_state.h"
#include "core/config/config.h"

namespace fp8tron {

struct TrainOptions {
  // Single-process groups even under a launcher (tests compare against this on every rank).
  bool force_single_process = false;
  // Return the global (TP-gathered) fp32 weights of this rank's parameters (final_weights and
  // final_weights_sample); real runs leave this off.
  bool collect_final_weights = false;
  // Return the same global weights as they are before the first iteration (initial_weights).
  bool collect_initial_weights = false;
  // Return every iteration's gradient norm (grad_norms); real runs leave this off.
  bool collect_grad_norms = false;
  // The bf16 linears' wgrad GEMMs write their main gradients in a step's first backward
  // (models/linear/main_grads.h); off: every main gradient is zeroed before a step (tests compare).
  bool main_grad_first_writes = true;
};

struct TrainResult {
  std::vector<double> losses;  // lm loss of every iteration run, averaged over data-parallel ranks
  // Mixture of experts: load_balancing_loss, z_loss, ... of every iteration, reduced as logged.
  std::map<std::string, std::vector<double>> moe_losses;
  // Multi-token prediction: "mtp_<k>" (depth k = 1, 2, ...) loss of every iteration, as logged.
  std::map<std::string, std::vector<double>> mtp_losses;
  // With collect_grad_norms: the global gradient norm of every iteration, before clipping, as
  // logged (grad norm); inf/nan where the step was skipped.
  std::vector<double> grad_norms;
  double last_validation_loss = 0;
  int64_t iterations = 0;      // the last iteration reached (< train_iters after an exit condition;
                               // a run resumed from a checkpoint counts the loaded iterations too)
  int64_t consumed_samples = 0;
  int64_t cuda_graph_replays = 0;  // --cuda-graph-impl full_iteration: the steps that replayed the graph
  uint64_t main_grad_first_writes = 0;  // the wgrad GEMMs' first writes of main gradients
  // --fine-grained-activation-offloading: the bytes this rank copied to host memory, per module.
  std::map<std::string, int64_t> activation_offload_bytes;
  // --overlap-param-gather-with-optimizer-step: parameter all-gather buckets this rank issued while
  // its optimizer step still had parameters to update, over the run.
  int64_t param_gathers_during_step = 0;
  // --data-parallel-sharding-strategy optim_grads_params: this rank's weight bytes gathered at most at
  // once, and all of them (what an unsharded rank holds); 0 without sharded weights.
  int64_t sharded_weights_peak_bytes = 0, sharded_weights_total_bytes = 0;
  // The same for the units' gradient buffers (sharded gradients); 0 without them.
  int64_t sharded_grads_peak_bytes = 0, sharded_grads_total_bytes = 0;
  std::string model_plan;  // --print-model-plan: this rank's plan (training then does not start)
  std::vector<double> final_weights_sample;          // a few values, for determinism tests
  std::map<std::string, torch::Tensor> final_weights;    // with collect_final_weights
  std::map<std::string, torch::Tensor> initial_weights;  // with collect_initial_weights
};

TrainResult train(const Config& config, const TrainOptions& options = {});

// The parallel state of a run: single process, or MPI (CPU) / NCCL (GPU) groups.
ParallelState make_parallel_state(const Config& config, bool force_single_process);

bool cuda_available();

}  // namespace fp8tron
