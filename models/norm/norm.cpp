#include "models/norm/norm.h"

namespace fp8tron {

NormOptions NormOptions::from(const ModelConfig& m, int64_t size) {
  return NormOptions{size, m.normalization, m.norm_epsilon, m.apply_layernorm_1p};
}

torch::Tensor torch_norm(const torch::Tensor& x, const NormOptions& o, const torch::Tensor& weight,
                         const torch::Tensor& bias) {
  const torch::Tensor gamma = o.zero_centered_gamma ? weight + 1 : weight;
  if (o.kind == Normalization::RMSNorm) return at::rms_norm(x, {o.size}, gamma, o.epsilon);
  return at::layer_norm(x, {o.size}, gamma, bias, o.epsilon);
}

}  // namespace fp8tron
