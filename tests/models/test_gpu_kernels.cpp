// GPU tests of the models' fused kernels against the unfused torch composition they replace
// (label gpu; skipped without a CUDA device, failing on any mismatch).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdio>

#include "models/loss/cross_entropy.h"
#include "models/linear/fused_linear.h"
#include "models/attention/qkv_split.h"
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

// Gradient-accumulation fusion: a bf16 linear whose weight gradient is an fp32 main-gradient
// buffer accumulates dW into it in the GEMM (autograd gets none); over two micro-batches the buffer
// holds what the unfused linear's bf16 gradients add up to, within bf16 rounding of each term,
// and the input and bias gradients are those of the unfused linear. Switched off, the fused
// function is the plain linear.
TEST(GpuKernels, LinearWithGradAccumulationFusionAddsIntoTheMainGradient) {
  REQUIRE_GPU();
  torch::manual_seed(5);
  const auto main_grads = make_main_grads();
  const auto opts = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kBFloat16);
  const auto w0 = torch::randn({96, 64}, opts) * 0.05, b0 = torch::randn({96}, opts) * 0.05;
  const std::vector<torch::Tensor> xs = {torch::randn({4, 32, 64}, opts), torch::randn({4, 32, 64}, opts)};
  const std::vector<torch::Tensor> dys = {torch::randn({4, 32, 96}, opts), torch::randn({4, 32, 96}, opts)};

  auto fused_w = w0.clone().requires_grad_(true), fused_b = b0.clone().requires_grad_(true);
  const auto initial = torch::randn({96, 64}, opts.dtype(torch::kFloat32));  // earlier accumulation
  fused_w.mutable_grad() = initial.clone();
  torch::Tensor main_grad = fused_w.grad();
  ASSERT_TRUE(grad_accumulation_fusion_applies(xs[0], fused_w, *main_grads));
  auto plain_w = w0.clone().requires_grad_(true), plain_b = b0.clone().requires_grad_(true);
  torch::Tensor expected = initial.clone();
  for (size_t i = 0; i < xs.size(); ++i) {
    auto xf = xs[i].clone().requires_grad_(true), xp = xs[i].clone().requires_grad_(true);
    linear_with_grad_accumulation_fusion(xf, fused_w, fused_b, main_grads).backward(dys[i]);
    auto yp = torch::nn::functional::linear(xp, plain_w, plain_b);
    yp.backward(dys[i]);
    expected += plain_w.grad().to(torch::kFloat32);
    plain_w.mutable_grad() = torch::Tensor();
    EXPECT_TRUE(torch::equal(xf.grad(), xp.grad())) << "input gradient, micro-batch " << i;
  }
  EXPECT_EQ(fused_w.grad().data_ptr(), main_grad.data_ptr()) << "the main gradient was replaced, not accumulated into";
  const double scale = expected.abs().max().item<double>();
  const double err = (fused_w.grad() - expected).abs().max().item<double>();
  std::printf("fused wgrad accumulation: max |diff| %.3g of max %.3g\n", err, scale);
  EXPECT_LT(err, scale * 1e-2) << "fused wgrad accumulation differs beyond bf16 rounding";
  EXPECT_TRUE(torch::allclose(fused_b.grad().to(torch::kFloat32), plain_b.grad().to(torch::kFloat32), 1e-2, 1e-2));

  // Without a bias (the output layer, --disable-bias-linear): same forward and input gradient.
  auto xn = xs[0].clone().requires_grad_(true), xq = xs[0].clone().requires_grad_(true);
  auto yn = linear_with_grad_accumulation_fusion(xn, fused_w, torch::Tensor(), main_grads);
  auto yq = torch::nn::functional::linear(xq, plain_w);
  EXPECT_TRUE(torch::equal(yn, yq)) << "forward without a bias";
  yn.backward(dys[0]);
  yq.backward(dys[0]);
  EXPECT_TRUE(torch::equal(xn.grad(), xq.grad())) << "input gradient without a bias";

  // The bias's gradient an fp32 main gradient too: one GEMM (BGRADB epilogue) adds both, the bias's
  // in fp32 (the exact sums of the bf16 dY over tokens, up to fp32 rounding).
  auto both_w = w0.clone().requires_grad_(true), both_b = b0.clone().requires_grad_(true);
  both_w.mutable_grad() = initial.clone();
  const auto initial_b = torch::randn({96}, opts.dtype(torch::kFloat32));
  both_b.mutable_grad() = initial_b.clone();
  torch::Tensor bias_main_grad = both_b.grad();
  auto expected_b = initial_b.to(torch::kFloat64);
  for (size_t i = 0; i < xs.size(); ++i) {
    linear_with_grad_accumulation_fusion(xs[i], both_w, both_b, main_grads).backward(dys[i]);
    expected_b += dys[i].to(torch::kFloat64).sum(std::vector<int64_t>{0, 1});
  }
  EXPECT_EQ(both_b.grad().data_ptr(), bias_main_grad.data_ptr()) << "the bias's main gradient was replaced";
  const double bias_err = (both_b.grad().to(torch::kFloat64) - expected_b).abs().max().item<double>();
  std::printf("fused bias gradient (BGRADB): max |diff| %.3g of max %.3g\n", bias_err, expected_b.abs().max().item<double>());
  EXPECT_LT(bias_err, 1e-4 * expected_b.abs().max().item<double>()) << "bias gradient from the wgrad GEMM";
  const double wgrad_err = (both_w.grad() - expected).abs().max().item<double>();
  EXPECT_LT(wgrad_err, scale * 1e-2) << "wgrad with the bias-gradient epilogue differs beyond bf16 rounding";

  EXPECT_FALSE(grad_accumulation_fusion_applies(xs[0], fused_w, *make_main_grads(false)))
      << "--no-gradient-accumulation-fusion ignored";
}

// The QKV split's backward (one contiguous gradient assembled by the strided-rows copy) against
// split_with_sizes' concatenation: bitwise, whatever the gradients' layouts (cuDNN's attention
// returns them permuted), with a missing gradient (zeros), in bf16 (16-byte vectors), fp32, and a
// head size whose rows are not whole vectors (element copies).
TEST(GpuKernels, QkvSplitBackwardMatchesTheConcatenation) {
  REQUIRE_GPU();
  struct Case {
    torch::Dtype dtype;
    int64_t groups, per_group, d;
    bool drop_v;
  };
  for (const auto& c : {Case{torch::kBFloat16, 4, 3, 64, false}, Case{torch::kFloat32, 2, 1, 32, false},
                        Case{torch::kBFloat16, 3, 2, 12, false}, Case{torch::kBFloat16, 2, 4, 128, true}}) {
    torch::manual_seed(5);
    const auto opts = torch::TensorOptions().device(torch::kCUDA).dtype(c.dtype);
    auto base = torch::randn({7, 3, c.groups, c.per_group + 2, c.d}, opts);
    // Upstream gradients in a permuted layout ([b, heads, s, d] in memory, viewed back).
    auto gq = torch::randn({3, c.groups, c.per_group, 7, c.d}, opts).permute({3, 0, 1, 2, 4});
    auto gk = torch::randn({3, c.groups, 7, c.d}, opts).permute({2, 0, 1, 3});
    auto gv = torch::randn({7, 3, c.groups, c.d}, opts);
    auto loss = [&](const std::vector<torch::Tensor>& p) {
      auto l = (p[0].to(torch::kFloat32) * gq.to(torch::kFloat32)).sum() + (p[1].to(torch::kFloat32) * gk.to(torch::kFloat32)).sum();
      return c.drop_v ? l : l + (p[2].to(torch::kFloat32) * gv.to(torch::kFloat32)).sum();
    };
    auto fused_in = base.clone().requires_grad_(true);
    auto fused = split_qkv(fused_in, c.per_group);
    ASSERT_EQ(fused[0].data_ptr(), fused_in.data_ptr()) << "the queries must be a view of qkv";
    loss(fused).backward();
    auto plain_in = base.clone().requires_grad_(true);
    auto parts = plain_in.split_with_sizes({c.per_group, 1, 1}, 3);
    loss({parts[0], parts[1].squeeze(3), parts[2].squeeze(3)}).backward();
    EXPECT_TRUE(torch::equal(fused[1], parts[1].squeeze(3)));
    EXPECT_TRUE(torch::equal(fused_in.grad(), plain_in.grad()))
        << c10::toString(c.dtype) << " d " << c.d << ": max difference "
        << (fused_in.grad() - plain_in.grad()).abs().max().item<double>();
  }
}

}  // namespace
}  // namespace fp8tron
