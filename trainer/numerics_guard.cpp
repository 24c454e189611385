#include "trainer/numerics_guard.h"

#include <ATen/cuda/CUDAEvent.h>

#include <cmath>

#include "core/error.h"

namespace fp8tron {

NumericsGuard::NumericsGuard(torch::Device device) : device_(device) {
  host_ = torch::zeros({2}, torch::kFloat64);
  if (device_.is_cuda()) host_ = host_.pin_memory();
}

NumericsGuard::~NumericsGuard() = default;

torch::Tensor NumericsGuard::values(const torch::Tensor& loss, const torch::Tensor& grad_norm) const {
  torch::NoGradGuard no_grad;
  return torch::stack({loss.detach().reshape({}).to(torch::kFloat64), grad_norm.detach().reshape({}).to(torch::kFloat64)});
}

torch::Tensor NumericsGuard::rejection(const torch::Tensor& values, const std::vector<rerun::ValidationCall>& calls,
                                       const rerun::PassPlan& plan) const {
  torch::NoGradGuard no_grad;
  if (plan.injected) return torch::ones({}, values.options().dtype(torch::kFloat32));
  // Per subject (0: loss, 1: grad norm): whether NaN, inf are rejected; the large-value thresholds.
  bool nan[2] = {false, false}, inf[2] = {false, false};
  std::vector<std::pair<int, double>> large;
  for (size_t i = 0; i < calls.size(); ++i) {
    const int s = calls[i].subject == rerun::Subject::kLoss ? 0 : 1;
    switch (calls[i].rejection) {
      case rerun::Rejection::kNan: nan[s] = true; break;
      case rerun::Rejection::kInf: inf[s] = true; break;
      case rerun::Rejection::kUnexpectedlyLarge:
        if (std::isfinite(plan.thresholds[i])) large.emplace_back(s, plan.thresholds[i]);
        break;
    }
  }
  torch::Tensor reject;
  auto add = [&reject](const torch::Tensor& r) { reject = reject.defined() ? reject.logical_or(r) : r; };
  if (nan[0] && inf[0] && nan[1] && inf[1]) {
    add(values.isfinite().logical_not().any());  // the NaN check's four calls at once
  } else {
    for (int s = 0; s < 2; ++s) {
      if (nan[s]) add(values[s].isnan());
      if (inf[s]) add(values[s].isinf());
    }
  }
  // rerun::rejects' rule for kUnexpectedlyLarge: finite and |v| >= threshold, in double.
  for (const auto& [s, threshold] : large) add(values[s].isfinite().logical_and(values[s].abs() >= threshold));
  if (!reject.defined()) return torch::zeros({}, values.options().dtype(torch::kFloat32));
  return reject.to(torch::kFloat32);
}

void NumericsGuard::start_read(const torch::Tensor& values) {
  FP8TRON_CHECK(!pending_, "NumericsGuard: a read was started twice");
  pending_ = true;
  if (!device_.is_cuda()) {
    host_.copy_(values);
    return;
  }
  host_.copy_(values, /*non_blocking=*/true);
  if (!copied_) copied_ = std::make_unique<c10::cuda::CUDAEvent>();
  copied_->record();
}

std::pair<double, double> NumericsGuard::finish_read() {
  FP8TRON_CHECK(pending_, "NumericsGuard: finish_read without start_read");
  pending_ = false;
  if (copied_) copied_->synchronize();
  return {host_[0].item<double>(), host_[1].item<double>()};
}

}  // namespace fp8tron
