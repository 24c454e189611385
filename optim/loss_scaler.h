// Loss scaling for fp16 (Megatron's ConstantGradScaler / DynamicGradScaler). With bf16 and fp32
// the scale is a constant 1. The dynamic scaler halves the scale after `hysteresis` overflowing
// steps (never below the minimum) and doubles it after `window` clean steps in a row.
#pragma once
#include <cstdint>

#include "core/config/precision_config.h"

namespace fp8tron {

class LossScaler {
 public:
  explicit LossScaler(const PrecisionConfig& config);
  double scale() const { return scale_; }
  bool dynamic() const { return dynamic_; }
  // Called once per optimizer step with whether any gradient was inf/nan.
  void update(bool found_inf);

  // State for checkpoints.
  int64_t growth_tracker() const { return growth_tracker_; }
  int hysteresis_tracker() const { return hysteresis_tracker_; }
  void restore(double scale, int64_t growth_tracker, int hysteresis_tracker);

 private:
  bool dynamic_;
  double scale_;
  double min_scale_;
  int64_t window_;
  int hysteresis_;
  int64_t growth_tracker_ = 0;
  int hysteresis_tracker_;
};

}  // namespace fp8tron
