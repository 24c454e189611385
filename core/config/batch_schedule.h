// The global batch size of each iteration: constant, growing with --rampup-batch-size (Megatron's
// RampupBatchsizeNumMicroBatchesCalculator before it was deprecated), or stepping with
// --step-batch-size-schedule (StepBatchsizeNumMicroBatchesCalculator); and update_train_iters.
// Torch-free arithmetic shared by the CLI (iteration count, validation) and the training loop
// (micro-batches per step).
#pragma once
#include <cstdint>
#include <optional>
#include <vector>

#include "core/config/training_config.h"

namespace fp8tron {

class BatchSchedule {
 public:
  // `micro_times_dp` = micro-batch size x data-parallel size.
  BatchSchedule(int64_t global_batch_size, int64_t micro_times_dp, std::optional<BatchRampup> rampup = std::nullopt,
                bool decrease_if_needed = false, std::vector<std::pair<int64_t, int64_t>> steps = {});
  // The schedule of a run with `data_parallel_size` ranks.
  static BatchSchedule of(const TrainingConfig& t, int64_t data_parallel_size);

  // The global batch size Megatron reports after `consumed` samples (the ramp-up's value).
  int64_t global_batch(int64_t consumed) const;
  // The batch actually run: the global batch, rounded down to a multiple of micro x dp with
  // --decrease-batch-size-if-needed.
  int64_t running_batch(int64_t consumed) const;
  int64_t micro_batches(int64_t consumed) const { return running_batch(consumed) / micro_times_dp_; }
  bool divisible(int64_t consumed) const { return global_batch(consumed) % micro_times_dp_ == 0; }
  bool ramps() const { return rampup_.has_value() || !steps_.empty(); }
  // update_train_iters: iterations of sample-based training over `train_samples`.
  int64_t train_iters(int64_t train_samples) const;
  // Every distinct running batch of the ramp-up (the constant batch included), for validation.
  std::vector<int64_t> running_batches() const;

 private:
  int64_t global_, micro_times_dp_;
  std::optional<BatchRampup> rampup_;
  bool decrease_;
  std::vector<std::pair<int64_t, int64_t>> steps_;
  double samples_per_increment_ = 0;
};

}  // namespace fp8tron
