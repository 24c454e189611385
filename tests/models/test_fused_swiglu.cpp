// The fused SwiGLU (models/mlp/fused_swiglu.h) on the CPU: the unfused chain the models ran before it,
// forward and gradient bitwise, in every dtype the models use (the GPU kernels are checked against
// the same chain in tests/models/test_gpu_swiglu.cpp).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <stdexcept>
#include <vector>

#include "fp8/fp8_linear.h"
#include "fp8/swiglu_backward.h"
#include "models/mlp/fused_swiglu.h"

namespace fp8tron {
namespace {

TEST(FusedSwiglu, CpuIsTheUnfusedChainBitwise) {
  for (const auto dtype : {torch::kFloat32, torch::kBFloat16, torch::kFloat16, torch::kFloat64}) {
    for (const std::vector<int64_t>& sizes : std::vector<std::vector<int64_t>>{{5, 2}, {7, 74}, {3, 2, 48}}) {
      SCOPED_TRACE(c10::toString(dtype));
      torch::manual_seed(4);
      auto x = (torch::randn(sizes) * 2).to(dtype);
      auto out_sizes = sizes;
      out_sizes.back() /= 2;
      auto dy = torch::randn(out_sizes).to(dtype);

      auto a = x.clone().requires_grad_(true);
      auto ya = fused_swiglu(a);
      ya.backward(dy);
      // The chain written out: first half the gate, second half the up projection.
      auto b = x.clone().requires_grad_(true);
      auto yb = torch::silu(b.narrow(-1, 0, sizes.back() / 2)) * b.narrow(-1, sizes.back() / 2, sizes.back() / 2);
      yb.backward(dy);
      ASSERT_EQ(ya.sizes(), yb.sizes());
      EXPECT_TRUE(torch::equal(ya, yb));
      EXPECT_TRUE(torch::equal(a.grad(), b.grad()));
    }
  }
}

// The backward the FP8 path calls outside autograd (fp8/swiglu_backward.h): on the CPU the chain's
// gradient bitwise, and an engine's swiglu_backward runs the kernel its model gave it, torch's
// until then.
TEST(FusedSwiglu, BackwardOutsideAutogradIsTheChainsGradient) {
  torch::manual_seed(6);
  auto x = (torch::randn({6, 40}) * 2).to(torch::kBFloat16);
  auto dy = torch::randn({6, 20}).to(torch::kBFloat16);
  auto leaf = x.clone().requires_grad_(true);
  fused_swiglu(leaf).backward(dy);
  EXPECT_TRUE(torch::equal(fused_swiglu_backward(dy, x), leaf.grad()));
  EXPECT_TRUE(torch::equal(fp8::torch_swiglu_backward(dy, x), leaf.grad()));

  static int calls = 0;
  fp8::Fp8Engine engine(fp8::Fp8EngineOptions{}, torch::Device(torch::kCPU));
  EXPECT_TRUE(torch::equal(engine.swiglu_backward(dy, x), leaf.grad()));
  engine.use_backward_kernels(nullptr, [](const torch::Tensor& g, const torch::Tensor& h) {
    ++calls;
    return fused_swiglu_backward(g, h);
  });
  EXPECT_TRUE(torch::equal(engine.swiglu_backward(dy, x), leaf.grad()));
  EXPECT_EQ(calls, 1);
  fp8::Fp8Engine other(fp8::Fp8EngineOptions{}, torch::Device(torch::kCPU));
  EXPECT_TRUE(torch::equal(other.swiglu_backward(dy, x), leaf.grad()));
  EXPECT_EQ(calls, 1) << "another engine keeps torch's backward";
  EXPECT_THROW(fused_swiglu_backward(torch::randn({6, 21}), x), std::logic_error);
}

TEST(FusedSwiglu, RefusesAnOddLastDimension) {
  EXPECT_THROW(fused_swiglu(torch::randn({4, 7})), std::logic_error);  // an internal check: the models always build [gate | up]
}

}  // namespace
}  // namespace fp8tron
