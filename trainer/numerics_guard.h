// Megatron's checks of a step's loss and gradient norm, without its re-runs (Megatron's rerun
// state machine re-runs an iteration to tell a transient fault from a reproducible result; fp8tron
// judges the first result, as Megatron does with --rerun-mode disabled):
//   --check-for-nan-in-loss-and-grad (on by default; --no-...)  a NaN or inf loss or gradient norm
//       stops the run (the iteration's update is not applied: non-finite gradients skip the step);
//       off with fp16's dynamic loss scale, where overflows are expected and skipped
//   --check-for-spiky-loss, --check-for-large-grads  a loss (gradient norm) at least 10x the largest
//       of the first 100 iterations is reported and training continues (Megatron's non-fatal
//       checks: SPIKY_LOSS_FACTOR and the gradient threshold are both 10, sampled 100 times)
// Megatron judges each rank's micro-batch losses and each gradient bucket's local norm; fp8tron
// judges the iteration's loss (averaged over micro-batches and data-parallel ranks) and the global
// gradient norm, which every rank holds, so every rank decides alike without a collective.
//
// The loop never waits for the GPU for this: record() queues a copy of the two numbers into pinned
// host memory; check() waits only for that copy, and is called where the gradients of the recorded
// step are still there (before the next step zeroes them) and before every save.
#pragma once
#include <torch/torch.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "core/config/training_config.h"

namespace fp8tron {

// What made a step fail the NaN check.
struct NumericsFailure {
  int64_t iteration = 0;
  std::string what;  // e.g. "the loss is NaN", "the gradient norm is inf"
  bool gradient = false;  // the gradient norm (not only the loss) is non-finite
};

class NumericsGuard {
 public:
  NumericsGuard(const NumericsChecks& checks, torch::Device device);
  ~NumericsGuard();

  bool active() const { return checks_.nan_in_loss_and_grad || checks_.spiky_loss || checks_.large_grads; }

  // After iteration `iteration`'s optimizer step (0-dim tensors on the device; no wait).
  void record(int64_t iteration, const torch::Tensor& loss, const torch::Tensor& grad_norm);

  // Judges the last recorded step once (waiting for its copy): spikes are logged; a non-finite
  // loss or gradient norm is returned when the NaN check is on.
  std::optional<NumericsFailure> check();
  int64_t warnings() const { return warnings_; }  // spikes reported so far

 private:
  // Megatron's RerunStateMachine.is_unexpectedly_large for one context ("loss", "grads").
  bool unexpectedly_large(const std::string& context, double value);

  NumericsChecks checks_;
  torch::Device device_;
  torch::Tensor host_;  // [loss, grad norm], pinned for a GPU
  struct Pending;
  std::unique_ptr<Pending> pending_;
  std::map<std::string, int64_t> sample_counts_;
  std::map<std::string, double> max_values_;
  int64_t warnings_ = 0;
};

}  // namespace fp8tron
