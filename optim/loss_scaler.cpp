#include "optim/loss_scaler.h"

#include <algorithm>

namespace fp8tron {

LossScaler::LossScaler(const PrecisionConfig& c)
    : dynamic_(c.dynamic_loss_scale()),
      scale_(c.params_dtype != ParamDtype::Fp16 ? 1.0 : c.static_loss_scale.value_or(c.initial_loss_scale)),
      min_scale_(c.min_loss_scale),
      window_(c.loss_scale_window),
      hysteresis_(c.hysteresis),
      hysteresis_tracker_(c.hysteresis) {}

void LossScaler::update(bool found_inf) {
  if (!dynamic_) return;
  if (found_inf) {
    growth_tracker_ = 0;
    if (--hysteresis_tracker_ <= 0) scale_ = std::max(scale_ * 0.5, min_scale_);
    return;
  }
  if (++growth_tracker_ == window_) {
    growth_tracker_ = 0;
    hysteresis_tracker_ = hysteresis_;
    scale_ *= 2.0;
  }
}

void LossScaler::restore(double scale, int64_t growth_tracker, int hysteresis_tracker) {
  scale_ = scale;
  growth_tracker_ = growth_tracker;
  hysteresis_tracker_ = hysteresis_tracker;
}

}  // namespace fp8tron
