// Megatron's OptimizerParamScheduler: learning rate and weight decay as functions of the number
// of samples consumed. The trainer advances it by the global batch after each optimizer step.
#pragma once
#include <cstdint>

#include "core/config/training_config.h"

namespace fp8tron {

class LrSchedule {
 public:
  explicit LrSchedule(const LrScheduleConfig& config) : c_(config) {}
  const LrScheduleConfig& config() const { return c_; }
  // --use-checkpoint-opt_param-scheduler: the checkpoint's schedule replaces the command line's.
  void set_config(const LrScheduleConfig& config) { c_ = config; }
  double lr_at(int64_t num_steps) const;
  // The same schedule for a parameter group with its own peak and minimum (--decoupled-lr).
  double lr_at(int64_t num_steps, double max_lr, double min_lr) const;
  double weight_decay_at(int64_t num_steps) const;
  void step(int64_t increment) { num_steps_ += increment; }
  int64_t num_steps() const { return num_steps_; }
  void set_num_steps(int64_t n) { num_steps_ = n; }
  double lr() const { return lr_at(num_steps_); }
  double lr(double max_lr, double min_lr) const { return lr_at(num_steps_, max_lr, min_lr); }
  double weight_decay() const { return weight_decay_at(num_steps_); }

 private:
  LrScheduleConfig c_;
  int64_t num_steps_ = 0;
};

}  // namespace fp8tron
