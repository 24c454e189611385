// Bit-for-bit comparison of tensors for the optimizer tests (tests/optim).
#pragma once
#include <gtest/gtest.h>
#include <torch/torch.h>

namespace fp8tron {

// Same dtype, shape and bits (elements of 1, 2, 4 or 8 bytes); the failure says how many differ.
inline ::testing::AssertionResult same_bits(const torch::Tensor& a, const torch::Tensor& b) {
  if (a.scalar_type() != b.scalar_type() || a.sizes() != b.sizes())
    return ::testing::AssertionFailure() << "dtype or shape differs";
  const auto size = a.element_size();
  const auto bits = size == 8 ? torch::kInt64 : size == 4 ? torch::kInt32 : size == 2 ? torch::kInt16 : torch::kInt8;
  const auto x = a.contiguous().view(bits), y = b.contiguous().view(bits);
  const int64_t differ = (x != y).sum().item<int64_t>();
  if (differ == 0) return ::testing::AssertionSuccess();
  const auto diff = (a.to(torch::kFloat64) - b.to(torch::kFloat64)).abs();
  return ::testing::AssertionFailure() << differ << " of " << a.numel() << " elements differ, max |difference| "
                                       << diff.max().item<double>();
}

}  // namespace fp8tron
