#include "core/config/batch_schedule.h"

#include "core/error.h"
#include "core/text.h"

namespace fp8tron {

BatchSchedule::BatchSchedule(int64_t global_batch_size, int64_t micro_times_dp, std::optional<BatchRampup> rampup,
                             bool decrease_if_needed)
    : global_(global_batch_size), micro_times_dp_(micro_times_dp), rampup_(rampup), decrease_(decrease_if_needed) {
  FP8TRON_CHECK(global_ > 0 && micro_times_dp_ > 0, "batch sizes must be positive");
  if (!rampup_) return;
  const BatchRampup& r = *rampup_;
  if (r.start <= 0) throw UserError("--rampup-batch-size: the start batch size must be positive");
  if (r.increment <= 0) throw UserError("--rampup-batch-size: the batch size increment must be positive");
  if (r.samples < 0) throw UserError("--rampup-batch-size: the ramp-up samples must not be negative");
  const int64_t diff = global_ - r.start;
  if (diff < 0)
    throw UserError(strprintf("--rampup-batch-size: the start batch size (%lld) is larger than --global-batch-size (%lld)",
                              (long long)r.start, (long long)global_));
  if (diff == 0)
    throw UserError("--rampup-batch-size: the start batch size equals --global-batch-size, so there is nothing to ramp "
                    "up (drop the flag)");
  if (diff % r.increment != 0)
    throw UserError(strprintf("--rampup-batch-size: --global-batch-size - start (%lld) is not divisible by the increment "
                              "(%lld)",
                              (long long)diff, (long long)r.increment));
  samples_per_increment_ = double(r.samples) / double(diff / r.increment);
}

int64_t BatchSchedule::global_batch(int64_t consumed) const {
  if (!rampup_ || consumed > rampup_->samples) return global_;
  // Megatron: steps = int(consumed / samples_per_increment) (Python float division).
  const int64_t steps = samples_per_increment_ > 0 ? int64_t(double(consumed) / samples_per_increment_) : 0;
  return rampup_->start + steps * rampup_->increment;
}

int64_t BatchSchedule::running_batch(int64_t consumed) const {
  const int64_t g = global_batch(consumed);
  return decrease_ ? g / micro_times_dp_ * micro_times_dp_ : g;
}

int64_t BatchSchedule::train_iters(int64_t train_samples) const {
  if (!rampup_) return train_samples / global_;
  // The ramp-up phase step by step (adding the reported batch, as update_train_iters does), then
  // whole constant batches; a partial last batch is dropped.
  int64_t iterations = 0, consumed = 0;
  while (consumed <= rampup_->samples && consumed <= train_samples) {
    consumed += global_batch(consumed);
    ++iterations;
  }
  if (train_samples > consumed) iterations += (train_samples - consumed) / global_;
  return iterations;
}

std::vector<int64_t> BatchSchedule::running_batches() const {
  std::vector<int64_t> out;
  if (rampup_)
    for (int64_t g = rampup_->start; g < global_; g += rampup_->increment)
      out.push_back(decrease_ ? g / micro_times_dp_ * micro_times_dp_ : g);
  out.push_back(decrease_ ? global_ / micro_times_dp_ * micro_times_dp_ : global_);
  return out;
}

}  // namespace fp8tron
