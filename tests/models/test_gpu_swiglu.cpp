// GPU tests of the fused SwiGLU (models/mlp/fused_swiglu.h) against the unfused torch chain it
// replaces (label gpu; skipped without a CUDA device, failing on any mismatch).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "models/linear/fused_linear.h"
#include "models/mlp/fused_swiglu.h"
#include "models/recompute/output_discarding_recompute.h"

namespace fp8tron {
namespace {

#define REQUIRE_GPU() \
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device"

const auto kCuda = torch::TensorOptions().device(torch::kCUDA);

struct Outcome {
  torch::Tensor y, dx;  // fp32 copies
};

// y = op(x) and dx from y.backward(dy), on a fresh leaf copy of x.
template <class Op>
Outcome run(Op op, const torch::Tensor& x, const torch::Tensor& dy) {
  auto leaf = x.detach().clone().requires_grad_(true);
  auto y = op(leaf);
  y.backward(dy);
  return {y.detach().to(torch::kFloat32), leaf.grad().to(torch::kFloat32)};
}

// max |a - b| / max |b|.
double relative_error(const torch::Tensor& a, const torch::Tensor& b) {
  return ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item<double>();
}

// Elements with |a - b| > rel * |b| + 2^-20 * max|b|. The absolute term, far below any bf16 or
// fp16 step of the tensor's large values, covers the reference's own fp32 rounding where
// silu'(g) = s (1 + g (1 - s)) cancels (g near -1.278).
int64_t beyond(const torch::Tensor& a, const torch::Tensor& b, double rel) {
  const double floor = std::ldexp(b.abs().max().item<double>(), -20);
  return ((a - b).abs() > b.abs() * rel + floor).sum().item<int64_t>();
}

struct Shape {
  std::vector<int64_t> sizes;  // of x; the last is 2f
  const char* why;
};

// Forward and backward against the unfused chain, on shapes that take the 16-byte path (f a
// multiple of 16 / element size) and the element-wise one (odd f, f = 12 in 2-byte types).
//   fp32: within 1e-6 of the unfused fp32 chain (max |difference| / max |value|): the kernels use
//         torch's silu and silu_backward formulas, so only the compiler's contraction of
//         multiply-adds can differ.
//   bf16 / fp16: within half a step of the dtype (2^-8 relative for bf16, 2^-11 for fp16) of the
//         fp32 chain on the same (upcast) inputs, elementwise: the fused op computes in fp32 and
//         rounds once. The unfused chain in that dtype rounds silu(gate) (and dy * up) before the
//         product, two roundings and a third in the difference: within 2^-6 (bf16) / 2^-9
//         (fp16) of it, elementwise, i.e. about one step of the dtype.
TEST(GpuKernels, FusedSwigluMatchesTheUnfusedChain) {
  REQUIRE_GPU();
  const std::vector<Shape> shapes = {
      {{1, 16}, "one 16-byte pack per half (bf16)"},
      {{3, 74}, "f = 37: element-wise"},
      {{64, 24}, "f = 12: 16-byte packs in fp32, element-wise in bf16"},
      {{257, 2000}, "f = 1000, odd row count"},
      {{128, 4, 11264}, "the 1.1B LLaMA's fc1 output [s, b, 2 x 5632]"},
      {{0, 32}, "no rows"},
  };
  for (const auto dtype : {torch::kFloat32, torch::kBFloat16, torch::kFloat16}) {
    for (const Shape& s : shapes) {
      SCOPED_TRACE(std::string(c10::toString(dtype)) + " " + s.why);
      torch::manual_seed(7);
      auto x = (torch::randn(s.sizes, kCuda) * 2).to(dtype);  // gates over silu's curved range
      auto out_sizes = s.sizes;
      out_sizes.back() /= 2;
      auto dy = torch::randn(out_sizes, kCuda).to(dtype);
      const Outcome fused = run(fused_swiglu, x, dy);
      const Outcome plain = run(unfused_swiglu, x, dy);
      if (x.numel() == 0) {
        EXPECT_EQ(fused.y.sizes(), plain.y.sizes());
        EXPECT_EQ(fused.dx.sizes(), plain.dx.sizes());
        continue;
      }
      if (dtype == torch::kFloat32) {
        const double ey = relative_error(fused.y, plain.y), edx = relative_error(fused.dx, plain.dx);
        std::printf("[swiglu] fp32 %s: y %.2e, dx %.2e relative to the unfused chain\n", s.why, ey, edx);
        EXPECT_LE(ey, 1e-6);
        EXPECT_LE(edx, 1e-6);
        continue;
      }
      const int p = dtype == torch::kBFloat16 ? 8 : 11;  // significand bits: half a step is 2^-p relative
      const Outcome exact = run(unfused_swiglu, x.to(torch::kFloat32), dy.to(torch::kFloat32));
      const int64_t fused_y = beyond(fused.y, exact.y, std::ldexp(1.0, -p));
      const int64_t fused_dx = beyond(fused.dx, exact.dx, std::ldexp(1.0, -p));
      const int64_t plain_y = beyond(plain.y, exact.y, std::ldexp(1.0, -p));
      const int64_t plain_dx = beyond(plain.dx, exact.dx, std::ldexp(1.0, -p));
      std::printf("[swiglu] %s %s: beyond half a step of the fp32 result: fused y %lld dx %lld of %lld / %lld; "
                  "unfused chain y %lld dx %lld\n",
                  c10::toString(dtype), s.why, (long long)fused_y, (long long)fused_dx, (long long)fused.y.numel(),
                  (long long)fused.dx.numel(), (long long)plain_y, (long long)plain_dx);
      EXPECT_EQ(fused_y, 0);
      EXPECT_EQ(fused_dx, 0);
      EXPECT_EQ(beyond(fused.y, plain.y, std::ldexp(1.0, 2 - p)), 0);
      EXPECT_EQ(beyond(fused.dx, plain.dx, std::ldexp(1.0, 2 - p)), 0);
    }
  }
}

// The element-wise path on sizes the 16-byte path takes, by misaligning the base pointer (a
// contiguous view one element into its storage): bitwise the same results. A non-contiguous input
// (a transposed view) is made contiguous first: bitwise the same too, its gradient in its layout.
TEST(GpuKernels, FusedSwigluPathsAgreeBitwise) {
  REQUIRE_GPU();
  for (const auto dtype : {torch::kFloat32, torch::kBFloat16}) {
    SCOPED_TRACE(c10::toString(dtype));
    torch::manual_seed(9);
    const int64_t rows = 33, f = 256;
    auto x = torch::randn({rows, 2 * f}, kCuda).to(dtype);
    auto dy = torch::randn({rows, f}, kCuda).to(dtype);
    const Outcome aligned = run(fused_swiglu, x, dy);

    auto storage = torch::empty({rows * 2 * f + 1}, kCuda.dtype(dtype));
    auto shifted = storage.narrow(0, 1, rows * 2 * f).view({rows, 2 * f});
    shifted.copy_(x);
    ASSERT_NE(reinterpret_cast<uintptr_t>(shifted.data_ptr()) % 16, 0u);
    auto leaf = shifted.detach().requires_grad_(true);  // stays misaligned: no copy on the way in
    auto y = fused_swiglu(leaf);
    y.backward(dy);
    EXPECT_TRUE(torch::equal(y.to(torch::kFloat32), aligned.y));
    EXPECT_TRUE(torch::equal(leaf.grad().to(torch::kFloat32), aligned.dx));

    auto xt = x.t().contiguous().t();  // same values, column-major
    ASSERT_FALSE(xt.is_contiguous());
    const Outcome strided = run(fused_swiglu, xt, dy);  // run()'s leaf is a clone: strides kept
    EXPECT_TRUE(torch::equal(strided.y, aligned.y));
    EXPECT_TRUE(torch::equal(strided.dx, aligned.dx));
  }
}

// The FP8 path's SwiGLU backward (outside autograd, installed into fp8/ by the modules) is the
// fused op's autograd gradient bitwise: the same kernel.
TEST(GpuKernels, FusedSwigluBackwardOutsideAutogradIsTheOpsGradient) {
  REQUIRE_GPU();
  torch::manual_seed(10);
  const int64_t rows = 4096, f = 1408;
  auto x = torch::randn({rows, 2 * f}, kCuda).to(torch::kBFloat16);
  auto dy = torch::randn({rows, f}, kCuda).to(torch::kBFloat16);
  auto leaf = x.clone().requires_grad_(true);
  fused_swiglu(leaf).backward(dy);
  EXPECT_TRUE(torch::equal(fused_swiglu_backward(dy, x), leaf.grad()));
}

// Under the output-discarding recomputation (--recompute-modules moe_act wraps the experts'
// activation this way): the output is freed after its consumer ran and replayed in backward;
// gradients are bitwise those of the plain run.
TEST(GpuKernels, FusedSwigluReplaysUnderOutputDiscardingRecompute) {
  REQUIRE_GPU();
  torch::manual_seed(13);
  auto x = torch::randn({64, 2 * 96}, kCuda).to(torch::kBFloat16).requires_grad_(true);
  auto w = torch::randn({96, 32}, kCuda).to(torch::kBFloat16).requires_grad_(true);
  torch::mm(fused_swiglu(x), w).sum().backward();
  const auto ref_gx = x.grad().clone(), ref_gw = w.grad().clone();
  x.mutable_grad().reset();
  w.mutable_grad().reset();

  OutputDiscardingRecompute checkpoint;
  auto y = checkpoint.run_one([](const torch::Tensor& t) { return fused_swiglu(t); }, x);
  auto product = torch::mm(y, w);
  checkpoint.discard(product);
  EXPECT_EQ(y.storage().nbytes(), 0u);
  product.sum().backward();
  EXPECT_TRUE(torch::equal(x.grad(), ref_gx));
  EXPECT_TRUE(torch::equal(w.grad(), ref_gw));
}

// SwiGLU then fc2 saving only fc2's input's input (swiglu_linear) against the two ops it stands for
// (fused_swiglu, then the fused linear): the same kernels on the same values, so the output, the
// input gradient and the fp32 main gradients of two micro-batches agree bit for bit, with and
// without a bias (fc2's input, recomputed by the backward's SwiGLU pass, is the forward's).
TEST(GpuKernels, SwigluLinearIsTheTwoOpsBitwise) {
  REQUIRE_GPU();
  torch::manual_seed(7);
  const auto bf16 = kCuda.dtype(torch::kBFloat16);
  const int64_t rows = 300, f = 344, out = 136;
  const std::vector<torch::Tensor> xs = {torch::randn({rows / 3, 3, 2 * f}, bf16), torch::randn({rows / 3, 3, 2 * f}, bf16)};
  const std::vector<torch::Tensor> dzs = {torch::randn({rows / 3, 3, out}, bf16), torch::randn({rows / 3, 3, out}, bf16)};
  const auto w_values = torch::randn({out, f}, bf16) * 0.05, b_values = torch::randn({out}, bf16);
  for (const bool with_bias : {true, false}) {
    struct Run {
      std::vector<torch::Tensor> zs, dxs;
      torch::Tensor w_grad, b_grad;
    };
    const auto main_grads = make_main_grads(true);
    const auto run_with = [&](bool fused) {
      auto w = w_values.clone().requires_grad_(true);
      w.mutable_grad() = torch::zeros({out, f}, kCuda.dtype(torch::kFloat32));
      torch::Tensor b;
      if (with_bias) {
        b = b_values.clone().requires_grad_(true);
        b.mutable_grad() = torch::zeros({out}, kCuda.dtype(torch::kFloat32));
      }
      Run r;
      for (size_t i = 0; i < xs.size(); ++i) {
        auto x = xs[i].clone().requires_grad_(true);
        auto z = fused ? swiglu_linear(x, w, b, main_grads)
                       : linear_with_grad_accumulation_fusion(fused_swiglu(x), w, b, main_grads);
        if (fused) EXPECT_NE(z.grad_fn()->name().find("SwigluLinear"), std::string::npos) << z.grad_fn()->name();
        z.backward(dzs[i]);
        r.zs.push_back(z.detach());
        r.dxs.push_back(x.grad());
      }
      r.w_grad = w.grad();
      if (with_bias) r.b_grad = b.grad();
      return r;
    };
    const Run fused = run_with(true), plain = run_with(false);
    const std::string tag = with_bias ? "with a bias: " : "without a bias: ";
    for (size_t i = 0; i < xs.size(); ++i) {
      EXPECT_TRUE(torch::equal(fused.zs[i], plain.zs[i])) << tag << "output of micro-batch " << i;
      EXPECT_TRUE(torch::equal(fused.dxs[i], plain.dxs[i])) << tag << "input gradient of micro-batch " << i;
    }
    EXPECT_TRUE(torch::equal(fused.w_grad, plain.w_grad)) << tag << "weight main gradient";
    if (with_bias) EXPECT_TRUE(torch::equal(fused.b_grad, plain.b_grad)) << tag << "bias main gradient";
  }
}

}  // namespace
}  // namespace fp8tron
