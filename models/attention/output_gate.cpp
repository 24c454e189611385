#include "models/attention/output_gate.h"

namespace fp8tron {

torch::Tensor apply_output_gate(const torch::Tensor& out, const torch::Tensor& gate) {
  const auto g = gate.reshape(out.sizes());
  return (out.to(torch::kFloat32) * torch::sigmoid(g.to(torch::kFloat32))).to(out.scalar_type());
}

}  // namespace fp8tron
