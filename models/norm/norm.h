// The norms of the transformer layers (LayerNorm, RMSNorm) as their modules hold them: the options
// every norm-owning module carries and the unfused norm through torch's ops. The fused residual add
// + norm is models/norm/residual_norm.h.
#pragma once
#include <torch/torch.h>

#include "core/config/model_config.h"

namespace fp8tron {

struct NormOptions {
  int64_t size = 0;
  Normalization kind = Normalization::LayerNorm;
  double epsilon = 1e-5;
  bool zero_centered_gamma = false;  // --apply-layernorm-1p: the weight stores gamma - 1
  static NormOptions from(const ModelConfig& m, int64_t size);
};

// norm(x) over the last dimension with gamma = weight (+ 1 when zero-centred) and, for LayerNorm,
// beta = bias (may be undefined), through torch's ops: the CPU path and the GPU tests' reference.
// The modules call apply_norm (models/norm/residual_norm.h), which runs the fused kernel on GPUs.
torch::Tensor torch_norm(const torch::Tensor& x, const NormOptions& o, const torch::Tensor& weight,
                         const torch::Tensor& bias);

}  // namespace fp8tron
