// A tensor's dtype as the models' CUDA kernels name it (core/cuda/float_type.h): none for dtypes
// they do not take.
#pragma once
#include <torch/torch.h>

#include <optional>

#include "core/cuda/float_type.h"

namespace fp8tron {

inline std::optional<kernels::FloatType> kernel_float_of(const torch::Tensor& t) {
  switch (t.scalar_type()) {
    case torch::kFloat32: return kernels::FloatType::kFloat32;
    case torch::kBFloat16: return kernels::FloatType::kBFloat16;
    case torch::kFloat16: return kernels::FloatType::kFloat16;
    default: return std::nullopt;
  }
}

}  // namespace fp8tron
