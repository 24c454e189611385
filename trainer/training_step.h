// One training iteration and one evaluation: the micro-batches of the global batch through the
// pipeline schedule (forward and backward, eagerly or as the step's CUDA graph), the gradient
// reductions, the FP8 scale update, the optimizer step, and the rerun engine's judgement of the
// iteration's loss and gradient norm (re-running it in place from a snapshot, or ending the run as
// Megatron does). The loop (trainer.cpp) calls run() once per iteration.
#pragma once
#include <torch/torch.h>

#include <functional>
#include <optional>
#include <string>

#include "rerun/rerun_state_machine.h"
#include "trainer/logging/timers.h"
#include "trainer/run_checkpoints.h"
#include "trainer/run_parts.h"
#include "trainer/run_progress.h"
#include "trainer/run_reporter.h"
#include "trainer/step_snapshot.h"

namespace fp8tron {

class TrainingStep {
 public:
  TrainingStep(RunParts& parts, RunProgress& progress, Timers& timers, RunCheckpoints& checkpoints,
               RunReporter& reporter);

  // --rampup-batch-size / --step-batch-size-schedule: the micro-batch count of `iteration`'s step
  // (Megatron saves a checkpoint when it grows).
  void update_batch_size(int64_t iteration);
  // Runs `iteration` (accepted by the rerun engine) and returns its loss (on the device).
  torch::Tensor run(int64_t iteration);
  // --iterations-to-skip: the iteration's samples are consumed without a step (Megatron's
  // dummy_train_step).
  void skip(int64_t iteration);
  // The validation loss over --eval-iters batches of the validation split.
  double evaluate();

 private:
  // One pass of an iteration: the forward and backward passes over every micro-batch, the gradient
  // reductions, the FP8 scale update, up to the gradient norm before the update. The rerun engine
  // may run it again from the state captured before the first pass.
  struct Pass {
    torch::Tensor loss, mtp;
    PreparedStep prepared;
  };
  Pass forward_backward(int64_t iteration);
  StepResult apply(Pass& pass, const torch::Tensor& skip);
  // The step's counters and schedule, once the rerun engine accepted `pass`.
  void account(const Pass& pass);
  // The rerun engine's decision to end the run (throws): the one-line fatal stop of --rerun-mode
  // disabled, or Megatron's exit 16/17, saving the state before the iteration first when asked.
  [[noreturn]] void end_run(int64_t iteration, const rerun::PassOutcome& outcome, const StepSnapshot* snapshot,
                            double loss, double grad_norm);

  // Micro-batch `micro_batch` (of `micro_batch_size` sequences per rank) of the batch that starts
  // at `first_sample`, this rank's part of it (Megatron's sampler and context-parallel shard), on
  // the device.
  Batch load_micro_batch(BatchLoader& loader, int64_t micro_batch, int64_t first_sample, int64_t micro_batch_size);
  // One chunk's forward of a micro-batch; `batch_of` gives the micro-batch when the stage reads it.
  // `loss_tokens` (--calculate-per-token-loss): the loss stage adds its micro-batch's loss-token count.
  using BatchOf = std::function<Batch()>;
  torch::Tensor forward_chunk(int chunk, const torch::Tensor& input, const BatchOf& batch_of,
                              torch::Tensor* loss_tokens = nullptr);
  // The step's forward and backward passes over every micro-batch through the pipeline schedule:
  // the sum of their losses (the loss stage adds their loss-token counts to `loss_tokens`).
  torch::Tensor run_micro_batches(int64_t micro_batches, double backward_scale,
                                  const std::function<Batch(int64_t)>& batch_of, torch::Tensor* loss_tokens);
  // Logs once how many turns the combined 1F1B schedule took (and held weight gradients ran).
  void report_turns(int64_t turns_before, int64_t held_before, int64_t micro_batches);
  // Mean loss of a global batch of `micro_batches`, averaged over micro-batches and data-parallel
  // ranks (all ranks); with --calculate-per-token-loss the summed loss over the global token count.
  torch::Tensor average_loss(torch::Tensor loss_sum, int64_t micro_batches, const torch::Tensor& loss_tokens) const;
  // The sum of a per-rank count over the pipeline (held by the last stage) and data-parallel ranks.
  torch::Tensor global_token_count(torch::Tensor local) const;
  // Each MTP depth's loss of the step, averaged as Megatron logs it.
  torch::Tensor mtp_losses(int64_t micro_batches);
  // Megatron's amax reduction of the step's FP8 statistics, then the new scales.
  void end_fp8_step();
  // --fp8tron-test-inject-nan ITER:PARAM: NaN in the first element of PARAM's gradient.
  void inject_nan_gradient();
  // The name of the first parameter (in pipeline order) whose gradient is not finite, on any rank.
  std::string first_nonfinite_grad_everywhere();

  RunParts& parts_;
  const Config& c_;
  RunProgress& progress_;
  Timers& timers_;
  RunCheckpoints& checkpoints_;
  RunReporter& reporter_;
  bool reported_turns_ = false;  // the combined 1F1B schedule's turns, logged after its first step
};

}  // namespace fp8tron
