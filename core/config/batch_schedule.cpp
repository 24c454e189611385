#include "core/config/batch_schedule.h"

#include "core/error.h"
#include "core/text.h"

namespace fp8tron {

BatchSchedule BatchSchedule::of(const TrainingConfig& t, int64_t data_parallel_size) {
  return BatchSchedule(t.global_batch_size, t.micro_batch_size * data_parallel_size, t.rampup, t.decrease_batch_size_if_needed,
                       t.step_batch_schedule);
}

BatchSchedule::BatchSchedule(int64_t global_batch_size, int64_t micro_times_dp, std::optional<BatchRampup> rampup,
                             bool decrease_if_needed, std::vector<std::pair<int64_t, int64_t>> steps)
    : global_(global_batch_size), micro_times_dp_(micro_times_dp), rampup_(rampup), decrease_(decrease_if_needed),
      steps_(std::move(steps)) {
  FP8TRON_CHECK(global_ > 0 && micro_times_dp_ > 0, "batch sizes must be positive");
  if (!steps_.empty()) {
    if (rampup_) throw UserError("--rampup-batch-size and --step-batch-size-schedule cannot be used together");
    if (decrease_) throw UserError("--step-batch-size-schedule does not support --decrease-batch-size-if-needed");
    if (steps_.front().first != 0)
      throw UserError("--step-batch-size-schedule: the first entry must have threshold 0");
    for (size_t i = 1; i < steps_.size(); ++i)
      if (steps_[i].first <= steps_[i - 1].first)
        throw UserError("--step-batch-size-schedule: the thresholds must be strictly increasing");
    for (const auto& [threshold, batch] : steps_)
      if (batch <= 0) throw UserError("--step-batch-size-schedule: batch sizes must be positive");
    global_ = steps_.back().second;
    return;
  }
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
  if (!steps_.empty()) {
    int64_t batch = steps_.front().second;
    for (const auto& [threshold, size] : steps_)
      if (consumed >= threshold) batch = size;
    return batch;
  }
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
  if (!steps_.empty()) {  // walk the schedule until the samples are consumed
    int64_t iterations = 0;
    for (int64_t consumed = 0; consumed < train_samples; ++iterations) consumed += global_batch(consumed);
    return iterations;
  }
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
  if (!steps_.empty()) {
    for (const auto& [threshold, batch] : steps_) out.push_back(batch);
    return out;
  }
  if (rampup_)
    for (int64_t g = rampup_->start; g < global_; g += rampup_->increment)
      out.push_back(decrease_ ? g / micro_times_dp_ * micro_times_dp_ : g);
  out.push_back(decrease_ ? global_ / micro_times_dp_ * micro_times_dp_ : global_);
  return out;
}

}  // namespace fp8tron
