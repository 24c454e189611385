#include "trainer/numerics_guard.h"

#include <ATen/cuda/CUDAEvent.h>

#include <cmath>

#include "core/log.h"
#include "core/text.h"

namespace fp8tron {
namespace {

// Megatron's constants: SPIKY_LOSS_FACTOR (pretrain_gpt.py) and check_grads' threshold, over the
// first num_samples values of each context (rerun_state_machine.py).
constexpr double kSpikyLossFactor = 10.0;
constexpr double kLargeGradsFactor = 10.0;
constexpr int64_t kSamples = 100;

std::string value_text(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return strprintf("%.6E", v);
}

}  // namespace

struct NumericsGuard::Pending {
  int64_t iteration = 0;
  std::optional<at::cuda::CUDAEvent> copied;  // GPU: the device-to-host copy's completion
};

NumericsGuard::NumericsGuard(const NumericsChecks& checks, torch::Device device) : checks_(checks), device_(device) {
  host_ = torch::zeros({2}, torch::kFloat64);
  if (device_.is_cuda()) host_ = host_.pin_memory();
}

NumericsGuard::~NumericsGuard() = default;

void NumericsGuard::record(int64_t iteration, const torch::Tensor& loss, const torch::Tensor& grad_norm) {
  if (!active()) return;
  torch::NoGradGuard no_grad;
  auto values = torch::stack({loss.detach().reshape({}).to(torch::kFloat64), grad_norm.detach().reshape({}).to(torch::kFloat64)});
  pending_ = std::make_unique<Pending>();
  pending_->iteration = iteration;
  if (device_.is_cuda()) {
    host_.copy_(values, /*non_blocking=*/true);
    pending_->copied.emplace();
    pending_->copied->record();
  } else {
    host_.copy_(values);
  }
}

std::optional<NumericsFailure> NumericsGuard::check() {
  if (!pending_) return std::nullopt;
  std::unique_ptr<Pending> p = std::move(pending_);
  if (p->copied) p->copied->synchronize();
  const double loss = host_[0].item<double>(), grad_norm = host_[1].item<double>();
  const int64_t it = p->iteration;
  if (checks_.nan_in_loss_and_grad && (!std::isfinite(loss) || !std::isfinite(grad_norm))) {
    NumericsFailure f;
    f.iteration = it;
    f.gradient = !std::isfinite(grad_norm);
    f.what = !std::isfinite(loss) ? "the loss is " + value_text(loss) + (f.gradient ? " and the gradient norm " + value_text(grad_norm) : "")
                                  : "the gradient norm is " + value_text(grad_norm);
    return f;
  }
  if (checks_.spiky_loss && unexpectedly_large("loss", loss) && ++warnings_)
    log::warning(strprintf("iteration %lld: Unexpected result %s (message='Spiky loss'): the loss is at least %gx the "
                           "largest of the first %lld iterations (%s); continuing (--check-for-spiky-loss)",
                           (long long)it, value_text(loss).c_str(), kSpikyLossFactor, (long long)kSamples,
                           value_text(max_values_["loss"]).c_str()));
  if (checks_.large_grads && unexpectedly_large("grads", grad_norm) && ++warnings_)
    log::warning(strprintf("iteration %lld: Unexpected result %s (message='found unexpected large grads'): the gradient "
                           "norm is at least %gx the largest of the first %lld iterations (%s); continuing "
                           "(--check-for-large-grads)",
                           (long long)it, value_text(grad_norm).c_str(), kLargeGradsFactor, (long long)kSamples,
                           value_text(max_values_["grads"]).c_str()));
  return std::nullopt;
}

bool NumericsGuard::unexpectedly_large(const std::string& context, double value) {
  value = std::fabs(value);
  if (!std::isfinite(value)) return false;  // NaN and inf are the NaN check's
  int64_t& count = sample_counts_[context];
  double& largest = max_values_[context];
  if (count < kSamples) {
    ++count;
    largest = std::max(largest, value);
    if (count == kSamples) log::info(strprintf(" > Max value for %s: %s", context.c_str(), value_text(largest).c_str()));
    return false;
  }
  return value >= largest * (context == "loss" ? kSpikyLossFactor : kLargeGradsFactor);
}

}  // namespace fp8tron
