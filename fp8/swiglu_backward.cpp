#include "fp8/swiglu_backward.h"

namespace fp8tron::fp8 {

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
