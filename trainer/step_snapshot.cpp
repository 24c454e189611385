#include "trainer/step_snapshot.h"

namespace fp8tron {

StepSnapshot::StepSnapshot(const torch::Device& device, fp8::Fp8Engine* fp8, std::vector<torch::Tensor> buffers)
    : rng_(RngSnapshot::capture(device)), fp8_(fp8), buffers_(std::move(buffers)) {
  torch::NoGradGuard no_grad;
  if (fp8_) fp8_state_ = fp8_->capture_step_state();
  saved_.reserve(buffers_.size());
  for (const auto& b : buffers_) saved_.push_back(b.clone());
}

void StepSnapshot::restore(MoeContext* moe) const {
  torch::NoGradGuard no_grad;
  rng_.restore();
  if (fp8_) fp8_->restore_step_state(*fp8_state_);
  for (size_t i = 0; i < buffers_.size(); ++i) buffers_[i].copy_(saved_[i]);
  if (moe)
    for (auto& [name, metric] : moe->metrics())
      if (metric.values.defined()) metric.values.zero_();
}

}  // namespace fp8tron
