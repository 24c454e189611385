// GPU tests of the models' fused kernels against the unfused torch composition they replace
// (label gpu; skipped without a CUDA device, failing on any mismatch).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdio>

#include "models/cross_entropy.h"
#include "parallel/parallel_state.h"
#include "parallel/tensor_parallel.h"

namespace fp8tron {
namespace {

#define REQUIRE_GPU() \
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device"

struct CrossEntropyCase {
  torch::Dtype dtype;
  int64_t vocab;  // 50304: 16-byte vectors; 50257: the element-wise path
};

// The fused cross entropy (one read of the logits, gradient in place) against the unfused fp32
// chain on the same logits: losses within fp32 rounding, gradients within the logits' dtype's
// rounding of the same values.
TEST(GpuKernels, FusedCrossEntropyMatchesTheUnfusedChain) {
  REQUIRE_GPU();
  auto tp = make_self_communicator("tp", 0);
  for (const auto& c : {CrossEntropyCase{torch::kBFloat16, 50304}, CrossEntropyCase{torch::kBFloat16, 50257},
                        CrossEntropyCase{torch::kFloat32, 50304}, CrossEntropyCase{torch::kFloat16, 1000}}) {
    torch::manual_seed(3);
    const auto opts = torch::TensorOptions().device(torch::kCUDA);
    auto base = (torch::randn({256, 2, c.vocab}, opts) * 3).to(c.dtype);
    auto target = torch::randint(0, c.vocab, {256, 2}, opts.dtype(torch::kInt64));
    auto weights = torch::rand({256, 2}, opts);  // an arbitrary upstream gradient per token

    auto fused_in = base.clone().requires_grad_(true);
    auto fused = fused_vocab_parallel_cross_entropy(fused_in * 1, target, 0, *tp);
    (fused * weights).sum().backward();
    auto plain_in = base.clone().requires_grad_(true);
    auto plain = vocab_parallel_cross_entropy(plain_in * 1, target, 0, *tp);
    (plain * weights).sum().backward();

    const double loss_err = ((fused - plain).abs().max() / plain.abs().max()).item<double>();
    auto gf = fused_in.grad().to(torch::kFloat32), gp = plain_in.grad().to(torch::kFloat32);
    const double grad_err = ((gf - gp).abs().max() / gp.abs().max()).item<double>();
    std::printf("[ce] %s vocab %lld: loss %.2e, gradient %.2e relative to the unfused chain\n",
                c10::toString(c.dtype), (long long)c.vocab, loss_err, grad_err);
    EXPECT_LT(loss_err, 1e-5);
    EXPECT_LT(grad_err, c.dtype == torch::kFloat32 ? 1e-5 : 1e-2);
  }
}

}  // namespace
}  // namespace fp8tron
