#include "fp8/swiglu_backward.h"

#include <atomic>

namespace fp8tron::fp8 {
namespace {
std::atomic<SwigluBackwardFn> installed{nullptr};
}  // namespace

void install_swiglu_backward(SwigluBackwardFn fn) { installed.store(fn); }

torch::Tensor swiglu_backward(const torch::Tensor& grad, const torch::Tensor& h) {
  const SwigluBackwardFn fn = installed.load();
  return fn ? fn(grad, h) : torch_swiglu_backward(grad, h);
}

torch::Tensor torch_swiglu_backward(const torch::Tensor& grad, const torch::Tensor& h) {
  auto halves = h.chunk(2, -1);
  const auto& gate = halves[0];
  const auto& up = halves[1];
  return torch::cat({at::silu_backward(grad * up, gate), grad * at::silu(gate)}, -1);
}

torch::Tensor torch_swiglu(const torch::Tensor& h) {
  auto halves = h.chunk(2, -1);
  return at::silu(halves[0]) * halves[1];
}

}  // namespace fp8tron::fp8
