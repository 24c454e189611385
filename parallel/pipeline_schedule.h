// Pipeline-parallel schedules: 1F1B (warmup / steady / cooldown) and Megatron's interleaved
// schedule over virtual stages. A rank runs its model chunks' forward and backward steps in
// schedule order; activations and their gradients travel between neighbouring stages as
// point-to-point messages. Sends are asynchronous (waited at the end of the step); receives wait,
// so any order that respects the data dependencies completes.
#pragma once
#include <torch/torch.h>

#include <functional>
#include <vector>

#include "parallel/all_to_all_turns.h"
#include "parallel/parallel_state.h"

namespace fp8tron {

struct PipelineStep {
  bool forward;
  int chunk;
  int64_t micro_batch;
  // A forward of the steady state, followed by its backward: with --overlap-moe-expert-parallel-comm
  // the two run as a combined pair. (With every forward in the warmup there is none.)
  bool steady = false;
};

// The order of forward/backward steps of `pp_rank` (Megatron's 1F1B, interleaved when chunks > 1
// with micro-batches in groups of `group`, --microbatch-group-size-per-virtual-pipeline-stage;
// 0 = the pipeline size). `extra_warmup_forward`: one more forward before the steady state, as
// Megatron's interleaved schedule has with --overlap-moe-expert-parallel-comm, so that the forward
// and the backward of each steady-state step belong to independent micro-batches.
std::vector<PipelineStep> pipeline_order(int pp_size, int pp_rank, int chunks, int64_t num_micro_batches, int64_t group = 0,
                                         bool extra_warmup_forward = false);

// Megatron's combined 1F1B schedule inside the interleaved pipeline (--overlap-moe-expert-parallel-comm
// with a virtual pipeline, combined_1f1b_schedule_for_interleaved_pipelining): each steady-state
// forward step and the backward step after it run as one pair taking turns at the expert-parallel
// all-to-alls (all_to_all_turns.h, the backward holding the turn first). Both steps' receives are
// waited before the pair and both sends go out after it; the warmup and cool-down steps run alone.
struct CombinedSteps {
  AllToAllTurns* turns = nullptr;  // null: every step runs alone
  torch::Device device = torch::kCPU;
  // At the end of each backward pass (--delay-wgrad-compute's held weight gradients).
  std::function<void()> after_backward;
};

// Megatron's overlap_p2p_comm for the interleaved schedule: a step's receive is posted before the
// previous step's compute instead of just before its own, so the transfer runs beside that compute
// (on the GPU the receive then waits only for compute issued before it). In the warmup only the
// last step prefetches, and the cool-down does not, unless `warmup_flush`.
struct PipelineOverlap {
  bool p2p = false;
  bool warmup_flush = false;
};

// Whether the receive of step i + 1 of `order` is posted before step i's compute.
bool prefetches_next_receive(const std::vector<PipelineStep>& order, size_t i, const PipelineOverlap& overlap);

class PipelineSchedule {
 public:
  // `activation_shape`: what flows between stages ([s(/tp), b, h]) in `dtype` on `device`.
  PipelineSchedule(const ParallelState& parallel, int chunks, std::vector<int64_t> activation_shape, torch::Dtype dtype,
                   torch::Device device, PipelineOverlap overlap = {}, CombinedSteps combined = {});

  // forward(chunk, micro_batch, input) runs one chunk; input is undefined on the first virtual
  // stage. On the last virtual stage it returns the micro-batch's loss, elsewhere the hidden
  // states. Backward scales each loss by `loss_scale`. Returns the sum of the losses (zero on
  // ranks without the last stage).
  using ForwardFn = std::function<torch::Tensor(int chunk, int64_t micro_batch, const torch::Tensor& input)>;
  // `before_last_backward` runs just before the step's last backward pass (gradient overlap).
  // `group`: the interleaved schedule's micro-batch group size (0 = the pipeline size).
  torch::Tensor run(int64_t num_micro_batches, const ForwardFn& forward, double loss_scale,
                    const std::function<void()>& before_last_backward = {}, int64_t group = 0);
  // Forward only (evaluation), micro-batch by micro-batch through the virtual stages.
  // `micro_batch_size` > 0: the micro-batches hold that many sequences instead of the activation
  // shape's (--eval-micro-batch-size).
  torch::Tensor run_forward_only(int64_t num_micro_batches, const ForwardFn& forward, int64_t micro_batch_size = 0);

 private:
  const ParallelState& parallel_;
  int chunks_;
  PipelineOverlap overlap_;
  CombinedSteps combined_;
  std::vector<int64_t> shape_;
  torch::TensorOptions options_;
};

}  // namespace fp8tron
