#include "optim/lr_schedule.h"

#include <algorithm>
#include <cmath>

namespace fp8tron {

double LrSchedule::lr_at(int64_t num_steps) const { return lr_at(num_steps, c_.max_lr, c_.min_lr); }

double LrSchedule::lr_at(int64_t num_steps, double max_lr, double min_lr) const {
  const double steps = double(num_steps);
  // Linear warmup from init_lr.
  if (c_.warmup_steps > 0 && steps <= c_.warmup_steps) return c_.init_lr + (max_lr - c_.init_lr) * steps / c_.warmup_steps;
  if (c_.decay_style == DecayStyle::Constant) return max_lr;
  if (num_steps > c_.decay_steps) return min_lr;
  if (c_.decay_style == DecayStyle::InverseSquareRoot) {
    const double warmup = std::max(c_.warmup_steps, 1.0);
    const double n = std::max(steps, 1.0);
    return std::max(min_lr, max_lr * std::sqrt(warmup) / std::sqrt(n));
  }
  const double decay_ratio = (steps - c_.warmup_steps) / (double(c_.decay_steps) - c_.warmup_steps);
  double coeff = 0;
  switch (c_.decay_style) {
    case DecayStyle::Linear: coeff = 1.0 - decay_ratio; break;
    case DecayStyle::Cosine: coeff = 0.5 * (std::cos(M_PI * decay_ratio) + 1.0); break;
    case DecayStyle::WSD: {
      // Warmup-stable-decay: constant until the last wsd_decay_steps, then anneal.
      const int64_t anneal_start = c_.decay_steps - c_.wsd_decay_steps;
      if (num_steps <= anneal_start) { coeff = 1.0; break; }
      const double r = double(num_steps - anneal_start) / double(c_.wsd_decay_steps);
      switch (c_.wsd_decay_style) {
        case WsdDecayStyle::Linear: coeff = 1.0 - r; break;
        case WsdDecayStyle::Cosine: coeff = 0.5 * (std::cos(M_PI * r) + 1.0); break;
        case WsdDecayStyle::Exponential: coeff = 2.0 * std::pow(0.5, r) - 1.0; break;
        case WsdDecayStyle::MinusSqrt: coeff = 1.0 - std::sqrt(r); break;
      }
      break;
    }
    default: break;
  }
  return min_lr + coeff * (max_lr - min_lr);
}

double LrSchedule::weight_decay_at(int64_t num_steps) const {
  if (num_steps > c_.wd_incr_steps) return c_.end_wd;
  if (c_.wd_incr_style == WeightDecayIncrStyle::Constant) return c_.end_wd;
  const double ratio = double(num_steps) / double(c_.wd_incr_steps);
  const double coeff = c_.wd_incr_style == WeightDecayIncrStyle::Linear ? ratio : 0.5 * (std::cos(M_PI * (1 - ratio)) + 1.0);
  return c_.start_wd + coeff * (c_.end_wd - c_.start_wd);
}

}  // namespace fp8tron
