// GPU tests of the fused residual add + norm (models/norm/residual_norm.h, models/norm/residual_norm_kernels.cu)
// against the unfused chain computed in fp32 from the same inputs, and of models wired through it
// against the layers run unfused (label gpu; skipped without a CUDA device, failing on any
// mismatch).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "models/linear/main_grads.h"
#include "models/norm/residual_norm.h"
#include "residual_norm_harness.h"
#include "tests/test_helpers.h"
#include "unfused_model.h"

namespace fp8tron {
namespace {
using namespace fp8tron::testing;

#define REQUIRE_GPU() \
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device"

const auto kCuda = torch::TensorOptions().device(torch::kCUDA);

struct Inputs {
  torch::Tensor residual, branch, weight, bias, c_sum, c_normed;
};

// Residuals with a non-zero mean per row (so LayerNorm's centring matters), a branch, gamma near 1
// (stored as gamma - 1 when zero-centred), a small beta, and the loss weights of the two outputs.
Inputs make_inputs(std::vector<int64_t> sizes, const NormOptions& o, torch::Dtype dtype, bool with_branch) {
  torch::manual_seed(17 + o.size);
  std::vector<int64_t> row_sizes = sizes;
  row_sizes.back() = 1;
  Inputs in;
  in.residual = (torch::randn(sizes, kCuda) * 2 + torch::randn(row_sizes, kCuda)).to(dtype);
  if (with_branch) in.branch = torch::randn(sizes, kCuda).to(dtype);
  in.weight = (torch::randn({o.size}, kCuda) * 0.1 + (o.zero_centered_gamma ? 0.0 : 1.0)).to(dtype);
  if (o.kind == Normalization::LayerNorm) in.bias = (torch::randn({o.size}, kCuda) * 0.1).to(dtype);
  in.c_sum = torch::randn(sizes, kCuda).to(dtype);
  in.c_normed = torch::randn(sizes, kCuda).to(dtype);
  return in;
}

ResidualNormRun fused_run(const Inputs& in, const NormOptions& o, bool use_sum = true, bool use_normed = true) {
  return run_residual_norm(
      [&](const torch::Tensor& r, const torch::Tensor& b, const torch::Tensor& w, const torch::Tensor& bb) {
        return residual_add_norm(r, b, o, w, bb, {}, make_main_grads());
      },
      in.residual, in.branch, in.weight, in.bias, use_sum ? in.c_sum : torch::Tensor(),
      use_normed ? in.c_normed : torch::Tensor());
}

// fused_run with the branch's pending bias `branch_bias` (a leaf the caller owns: its gradient stays
// there, in autograd's .grad or in its main gradient as `main_grads` says).
ResidualNormRun fused_run_with_branch_bias(const Inputs& in, const NormOptions& o, const torch::Tensor& branch_bias,
                                           const MainGradsPtr& main_grads) {
  return run_residual_norm(
      [&](const torch::Tensor& r, const torch::Tensor& b, const torch::Tensor& w, const torch::Tensor& bb) {
        return residual_add_norm(r, b, o, w, bb, branch_bias, main_grads);
      },
      in.residual, in.branch, in.weight, in.bias, in.c_sum, in.c_normed);
}

// The exact result in fp32 of the same rounded inputs: the sum as torch's add rounds it (in the
// inputs' dtype), then the norm in fp32 on it with gamma = weight (+ 1) in fp32; its gradient
// passes through the add (in bf16/fp16 see below).
ResidualNormRun exact_run(const Inputs& in, const NormOptions& o, bool use_sum = true, bool use_normed = true) {
  auto f32 = [](const torch::Tensor& t) { return t.defined() ? t.to(torch::kFloat32) : t; };
  const auto rounded_sum = in.branch.defined() ? (in.residual + in.branch) : in.residual;
  NormOptions exact = o;
  exact.zero_centered_gamma = false;
  auto run = run_residual_norm(
      [&](const torch::Tensor& s, const torch::Tensor&, const torch::Tensor& w, const torch::Tensor& bb) {
        const auto gamma = o.zero_centered_gamma ? w + 1 : w;
        return ResidualNormOutput{s, torch_norm(s, exact, gamma, bb)};
      },
      f32(rounded_sum), {}, f32(in.weight), f32(in.bias), use_sum ? f32(in.c_sum) : torch::Tensor(),
      use_normed ? f32(in.c_normed) : torch::Tensor());
  const auto dtype = in.residual.scalar_type();
  if (use_sum && use_normed && dtype != torch::kFloat32) {
    // The fused backward rounds the norm's gradient to the inputs' dtype before adding the sum's,
    // as the unfused chain (the norm's backward, then autograd's add) does: its result is one
    // rounding of the kernel's own norm gradient (checked against the exact one by the tests
    // without the sum's gradient) plus the sum's.
    const auto norm_only = fused_run(in, o, /*use_sum=*/false, /*use_normed=*/true);
    run.d_residual = norm_only.d_residual.to(torch::kFloat32) + f32(in.c_sum);
  }
  return run;
}

// fp32: max |a - b| / max |b| within 1e-5 (the kernels sum in another order than torch).
// bf16 / fp16: every element within one unit in the last place of the dtype of the fp32 result
// (2^-7 relative for bf16, 2^-10 for fp16: one rounding of a value within fp32 noise of it), plus
// 2^-16 of the tensor's largest value for elements where the gradient formulas cancel (a gradient
// near zero, fp32 rounding of the terms).
int64_t beyond_tolerance(const torch::Tensor& a, const torch::Tensor& exact, torch::Dtype dtype) {
  const auto x = a.to(torch::kFloat64), y = exact.to(torch::kFloat64);
  const double scale = y.abs().max().item<double>();
  if (dtype == torch::kFloat32) return (x - y).abs().max().item<double>() <= 1e-5 * scale ? 0 : 1;
  const double ulp = dtype == torch::kBFloat16 ? std::ldexp(1.0, -7) : std::ldexp(1.0, -10);
  return ((x - y).abs() > y.abs() * ulp + std::ldexp(scale, -16)).sum().item<int64_t>();
}

double relative_error(const torch::Tensor& a, const torch::Tensor& b) {
  const auto x = a.to(torch::kFloat64), y = b.to(torch::kFloat64);
  return ((x - y).abs().max() / y.abs().max().clamp_min(1e-30)).item<double>();
}

// normed and every gradient the fused run has (the branch's is the residual's).
void expect_close_to_exact(const ResidualNormRun& fused, const ResidualNormRun& exact, torch::Dtype dtype) {
  std::vector<std::pair<const char*, std::pair<torch::Tensor, torch::Tensor>>> pairs = {
      {"normed", {fused.normed, exact.normed}},
      {"residual's gradient", {fused.d_residual, exact.d_residual}},
      {"weight's gradient", {fused.d_weight, exact.d_weight}},
      {"bias's gradient", {fused.d_bias, exact.d_bias}},
  };
  if (fused.d_branch.defined()) pairs.push_back({"branch's gradient", {fused.d_branch, exact.d_residual}});
  for (const auto& [what, p] : pairs) {
    ASSERT_EQ(p.first.defined(), p.second.defined()) << what;
    if (!p.first.defined()) continue;
    ASSERT_EQ(p.first.sizes(), p.second.sizes()) << what;
    const int64_t n = beyond_tolerance(p.first, p.second, dtype);
    EXPECT_EQ(n, 0) << what << ": " << n << " elements beyond tolerance, max relative error "
                    << relative_error(p.first, p.second);
  }
}

const char* kind_name(const NormOptions& o) { return o.kind == Normalization::RMSNorm ? "RMSNorm" : "LayerNorm"; }

// Hidden sizes of the 16-byte path (768, 2048, 5120, 8192 = the widest; 64: sixteen rows per
// block), the element-wise one (1000; in fp32 also 16-byte), LayerNorm and RMSNorm, zero-centred
// gamma on every other size; 259 rows (not a multiple of any block's rows). The sum must be
// torch's add bit for bit.
TEST(GpuKernels, ResidualNormMatchesTheFp32Chain) {
  REQUIRE_GPU();
  const std::vector<int64_t> hiddens = {768, 2048, 1000, 5120, 8192, 64};
  for (const auto dtype : {torch::kFloat32, torch::kBFloat16, torch::kFloat16}) {
    for (size_t i = 0; i < hiddens.size(); ++i) {
      for (const auto kind : {Normalization::LayerNorm, Normalization::RMSNorm}) {
        const NormOptions o{hiddens[i], kind, 1e-5, i % 2 == 1};
        const std::string what = std::string(c10::toString(dtype)) + " " + kind_name(o) + " hidden " +
                                 std::to_string(o.size) + (o.zero_centered_gamma ? " zero-centred" : "");
        SCOPED_TRACE(what);
        const Inputs in = make_inputs({37, 7, o.size}, o, dtype, true);
        const auto fused = fused_run(in, o);
        const auto exact = exact_run(in, o);
        EXPECT_NE(fused.node.find("ResidualNorm"), std::string::npos) << "the kernels did not run: " << fused.node;
        EXPECT_TRUE(torch::equal(fused.sum, in.residual + in.branch)) << "the sum is not torch's add";
        expect_close_to_exact(fused, exact, dtype);
        std::printf("[residual norm] %s: max relative error normed %.2e, d_in %.2e, d_gamma %.2e\n", what.c_str(),
                    relative_error(fused.normed, exact.normed), relative_error(fused.d_residual, exact.d_residual),
                    relative_error(fused.d_weight, exact.d_weight));
      }
    }
  }
}

// The branch's pending bias (ResidualStream::branch_bias, Megatron's skip_bias_add): the fused add
// + norm with the bias equals, bit for bit, the same op on branch + bias added first by torch
// (sum, normed and every other gradient); the bias's gradient is the fp32 sum over tokens of the
// branch's gradient, written into a fresh tensor for autograd, added to a main gradient, or
// written over a stale one in a step's first write (models/linear/main_grads.h). Also past
// the kernels' widest row (hidden 9000) and through ResidualStream::sum(), where torch's ops run.
TEST(GpuKernels, ResidualNormAddsTheBranchBiasAndSumsItsGradient) {
  REQUIRE_GPU();
  for (const auto dtype : {torch::kFloat32, torch::kBFloat16}) {
    for (const int64_t hidden : {768, 1000, 9000}) {
      for (const auto kind : {Normalization::LayerNorm, Normalization::RMSNorm}) {
        const NormOptions o{hidden, kind, 1e-5, false};
        const std::string what = std::string(c10::toString(dtype)) + " " + kind_name(o) + " hidden " + std::to_string(hidden);
        SCOPED_TRACE(what);
        const Inputs in = make_inputs({37, 7, o.size}, o, dtype, true);
        const auto branch_bias = (torch::randn({o.size}, kCuda) * 0.5).to(dtype);
        // Pre-added: the reference for everything but the bias's gradient.
        const Inputs added{in.residual, in.branch + branch_bias, in.weight, in.bias, in.c_sum, in.c_normed};
        const auto want = fused_run(added, o);
        const auto want_bias_grad = want.d_branch.to(torch::kFloat64).reshape({-1, o.size}).sum(0);
        const auto bias_error = [&](const torch::Tensor& g) {
          return relative_error(g.to(torch::kFloat64), want_bias_grad);
        };
        // fp32 sums in another order than fp64's, of bf16 gradients kept in fp32 until stored.
        const double tolerance = 1e-5;

        // Autograd gets the bias's gradient (no main gradient), in the bias's dtype.
        const auto leaf = branch_bias.detach().clone().requires_grad_(true);
        const auto main_grads = make_main_grads();
        const auto got = fused_run_with_branch_bias(in, o, leaf, main_grads);
        EXPECT_TRUE(torch::equal(got.sum, want.sum)) << "sum";
        EXPECT_TRUE(torch::equal(got.normed, want.normed)) << "normed";
        EXPECT_TRUE(torch::equal(got.d_residual, want.d_residual)) << "residual's gradient";
        EXPECT_TRUE(torch::equal(got.d_weight, want.d_weight)) << "gamma's gradient";
        if (want.d_bias.defined()) EXPECT_TRUE(torch::equal(got.d_bias, want.d_bias)) << "beta's gradient";
        ASSERT_TRUE(leaf.grad().defined());
        EXPECT_EQ(leaf.grad().scalar_type(), dtype);
        EXPECT_LE(bias_error(leaf.grad().to(torch::kFloat32)),
                  dtype == torch::kFloat32 ? tolerance : std::ldexp(1.0, -8))  // one rounding to bf16
            << "the bias's gradient for autograd";

        // A main gradient: added to, then written over in a step's first write.
        auto param = branch_bias.detach().clone().requires_grad_(true);
        param.mutable_grad() = torch::ones({o.size}, kCuda.dtype(torch::kFloat32));
        fused_run_with_branch_bias(in, o, param, main_grads);
        EXPECT_LE(relative_error(param.grad().to(torch::kFloat64) - 1.0, want_bias_grad), tolerance) << "added";
        main_grads->own({param});
        main_grads->new_step();
        param.grad().fill_(1e30);  // stale: must not be read
        fused_run_with_branch_bias(in, o, param, main_grads);
        EXPECT_LE(bias_error(param.grad()), tolerance) << "first write";

        // The unfused sum (a stage's output, a recomputed unit's input): the same gradient.
        main_grads->own({});
        param.grad().fill_(0.0);
        auto r = in.residual.detach().clone().requires_grad_(true);
        (ResidualStream{r, in.branch, param}.sum(main_grads).to(torch::kFloat32) * in.c_sum.to(torch::kFloat32)).sum().backward();
        const auto c_sum_sums = in.c_sum.to(torch::kFloat64).reshape({-1, o.size}).sum(0);
        EXPECT_LE(relative_error(param.grad().to(torch::kFloat64), c_sum_sums), tolerance) << "through sum()";
      }
    }
  }
}

// gamma's and beta's gradients go into the parameters' fp32 main gradients where they have them
// (NormGradRequest): written over a stale value in a step's first write, the fp32 sum whose one
// rounding autograd gets without a main gradient (bitwise); added to one otherwise; and autograd
// then gets nothing for them (no AccumulateGrad add). The norm + linear and the norm + GeLU MLP
// share this backward pass (tests/models/test_gpu_norm_linear.cpp compares them with the plain op).
TEST(GpuKernels, ResidualNormSumsGammaAndBetaIntoTheirMainGradients) {
  REQUIRE_GPU();
  for (const auto dtype : {torch::kFloat32, torch::kBFloat16}) {
    for (const auto kind : {Normalization::LayerNorm, Normalization::RMSNorm}) {
      const NormOptions o{768, kind, 1e-5, false};
      SCOPED_TRACE(std::string(c10::toString(dtype)) + " " + kind_name(o));
      const Inputs in = make_inputs({37, 7, o.size}, o, dtype, true);
      const auto want = fused_run(in, o);  // leaves without main gradients: autograd's gradients
      ASSERT_TRUE(want.d_weight.defined());
      auto weight = in.weight.detach().clone().requires_grad_(true);
      auto bias = in.bias.defined() ? in.bias.detach().clone().requires_grad_(true) : torch::Tensor();
      std::vector<torch::Tensor> params{weight};
      if (bias.defined()) params.push_back(bias);
      for (auto& p : params) p.mutable_grad() = torch::full(p.sizes(), 1e30, kCuda.dtype(torch::kFloat32));
      const auto main_grads = make_main_grads();
      main_grads->own(params);
      main_grads->new_step();
      const auto run = [&] {
        auto r = in.residual.detach().clone().requires_grad_(true), b = in.branch.detach().clone().requires_grad_(true);
        const auto out = residual_add_norm(r, b, o, weight, bias, {}, main_grads);
        ((out.sum * in.c_sum).sum() + (out.normed * in.c_normed).sum()).backward();
        EXPECT_TRUE(torch::equal(r.grad(), want.d_residual)) << "residual's gradient";
      };
      run();  // the first write
      const auto written_gamma = weight.grad().clone();
      const auto written_beta = bias.defined() ? bias.grad().clone() : torch::Tensor();
      EXPECT_TRUE(torch::equal(written_gamma.to(dtype), want.d_weight)) << "gamma's main gradient, rounded";
      if (bias.defined()) EXPECT_TRUE(torch::equal(written_beta.to(dtype), want.d_bias)) << "beta's main gradient, rounded";
      run();  // added to
      EXPECT_TRUE(torch::equal(weight.grad(), written_gamma + written_gamma)) << "gamma's, added";
      if (bias.defined()) EXPECT_TRUE(torch::equal(bias.grad(), written_beta + written_beta)) << "beta's, added";
      if (bias.defined()) {
        // A frozen gamma: beta's gradient alone (the reduction's gamma row is not asked for).
        weight.requires_grad_(false);
        weight.mutable_grad() = torch::Tensor();
        main_grads->own({bias});
        main_grads->new_step();
        bias.grad().fill_(1e30);
        run();
        EXPECT_TRUE(torch::equal(bias.grad(), written_beta)) << "beta's main gradient with gamma frozen";
        EXPECT_FALSE(weight.grad().defined());
      }
    }
  }
}

// Without a branch it is the norm of the residual alone; with either output unused its gradient is
// absent: only the normed output (d_sum zero), only the sum (the gradient passes through as it is,
// no parameter gradients).
TEST(GpuKernels, ResidualNormWithoutABranchOrWithAnOutputUnused) {
  REQUIRE_GPU();
  for (const auto dtype : {torch::kFloat32, torch::kBFloat16}) {
    const NormOptions o{768, Normalization::LayerNorm, 1e-5, false};
    SCOPED_TRACE(c10::toString(dtype));
    {
      // (Were the sum used too, autograd would add its gradient to the norm's in the dtype, a second
      // rounding, as before the fusion.)
      SCOPED_TRACE("no branch");
      const Inputs in = make_inputs({64, 4, 768}, o, dtype, false);
      const auto fused = fused_run(in, o, false, true), exact = exact_run(in, o, false, true);
      EXPECT_NE(fused.node.find("ResidualNorm"), std::string::npos) << fused.node;
      EXPECT_TRUE(torch::equal(fused.sum, in.residual));
      EXPECT_FALSE(fused.d_branch.defined());
      expect_close_to_exact(fused, exact, dtype);
    }
    const Inputs in = make_inputs({64, 4, 768}, o, dtype, true);
    {
      SCOPED_TRACE("normed only");
      expect_close_to_exact(fused_run(in, o, false, true), exact_run(in, o, false, true), dtype);
    }
    {
      SCOPED_TRACE("sum only");
      const auto fused = fused_run(in, o, true, false);
      EXPECT_TRUE(torch::equal(fused.d_residual, in.c_sum));
      EXPECT_TRUE(torch::equal(fused.d_branch, in.c_sum));
      EXPECT_TRUE(!fused.d_weight.defined() || fused.d_weight.eq(0).all().item<bool>());
    }
  }
}

// Two runs of the same inputs give the same bits, parameter gradients included (their per-block
// partial sums are reduced in a fixed order, no atomics): GPT-2's shape (8192 tokens x 768) and a
// LLaMA-like one.
TEST(GpuKernels, ResidualNormIsDeterministic) {
  REQUIRE_GPU();
  for (const NormOptions& o : {NormOptions{768, Normalization::LayerNorm, 1e-5, false},
                               NormOptions{2048, Normalization::RMSNorm, 1e-6, true}}) {
    SCOPED_TRACE(kind_name(o));
    const Inputs in = make_inputs({1024, 8, o.size}, o, torch::kBFloat16, true);
    const auto a = fused_run(in, o), b = fused_run(in, o);
    EXPECT_TRUE(torch::equal(a.sum, b.sum));
    EXPECT_TRUE(torch::equal(a.normed, b.normed));
    EXPECT_TRUE(torch::equal(a.d_residual, b.d_residual));
    EXPECT_TRUE(torch::equal(a.d_weight, b.d_weight));
    if (a.d_bias.defined()) EXPECT_TRUE(torch::equal(a.d_bias, b.d_bias));
    expect_close_to_exact(a, exact_run(in, o), torch::kBFloat16);
  }
}

// Inputs one element into their storage (not 16-byte aligned) take the element-wise kernels; a
// non-contiguous input is made contiguous first. Both against the fp32 chain.
TEST(GpuKernels, ResidualNormTakesMisalignedAndStridedInputs) {
  REQUIRE_GPU();
  const NormOptions o{768, Normalization::RMSNorm, 1e-5, false};
  Inputs in = make_inputs({96, 768}, o, torch::kBFloat16, true);
  const auto exact = exact_run(in, o);
  auto storage = torch::empty({96 * 768 + 1}, kCuda.dtype(torch::kBFloat16));
  auto shifted = storage.narrow(0, 1, 96 * 768).view({96, 768});
  shifted.copy_(in.residual);
  ASSERT_NE(reinterpret_cast<uintptr_t>(shifted.data_ptr()) % 16, 0u);
  Inputs misaligned = in;
  misaligned.residual = shifted;
  const auto fused = run_residual_norm(
      [&](const torch::Tensor&, const torch::Tensor& b, const torch::Tensor& w, const torch::Tensor& bb) {
        return residual_add_norm(shifted, b, o, w, bb, {}, make_main_grads());  // the view itself: run's leaf would be a fresh copy
      },
      in.residual, in.branch, in.weight, in.bias, in.c_sum, in.c_normed);
  EXPECT_NE(fused.node.find("ResidualNorm"), std::string::npos) << fused.node;
  ResidualNormRun with_residual_grad = fused;  // the view is no leaf: the branch's gradient stands for it
  with_residual_grad.d_residual = fused.d_branch;
  expect_close_to_exact(with_residual_grad, exact, torch::kBFloat16);

  Inputs strided = in;
  strided.residual = in.residual.t().contiguous().t();
  ASSERT_FALSE(strided.residual.is_contiguous());
  expect_close_to_exact(fused_run(strided, o), exact, torch::kBFloat16);
}

// Where the kernels do not apply the op is the unfused chain, bit for bit: rows wider than 8192, a
// branch that broadcasts. No rows: empty outputs, zero parameter gradients.
TEST(GpuKernels, ResidualNormFallsBackToTheChainAndTakesNoRows) {
  REQUIRE_GPU();
  auto chain = [](const NormOptions& o) {
    return [o](const torch::Tensor& r, const torch::Tensor& b, const torch::Tensor& w, const torch::Tensor& bb) {
      return unfused_residual_add_norm(r, b, o, w, bb, {}, make_main_grads());
    };
  };
  {
    const NormOptions o{8200, Normalization::LayerNorm, 1e-5, false};
    const Inputs in = make_inputs({8, 8200}, o, torch::kBFloat16, true);
    const auto fused = fused_run(in, o);
    const auto plain = run_residual_norm(chain(o), in.residual, in.branch, in.weight, in.bias, in.c_sum, in.c_normed);
    EXPECT_EQ(fused.node.find("ResidualNorm"), std::string::npos);
    EXPECT_TRUE(torch::equal(fused.normed, plain.normed));
    EXPECT_TRUE(torch::equal(fused.d_residual, plain.d_residual));
  }
  {
    const NormOptions o{768, Normalization::RMSNorm, 1e-5, false};
    Inputs in = make_inputs({8, 768}, o, torch::kBFloat16, true);
    in.branch = in.branch.narrow(0, 0, 1);  // [1, 768] added to every row
    const auto fused = fused_run(in, o);
    const auto plain = run_residual_norm(chain(o), in.residual, in.branch, in.weight, in.bias, in.c_sum, in.c_normed);
    EXPECT_EQ(fused.node.find("ResidualNorm"), std::string::npos);
    EXPECT_TRUE(torch::equal(fused.normed, plain.normed));
    EXPECT_TRUE(torch::equal(fused.d_branch, plain.d_branch));
  }
  {
    const NormOptions o{768, Normalization::LayerNorm, 1e-5, false};
    const Inputs in = make_inputs({0, 4, 768}, o, torch::kBFloat16, true);
    const auto fused = fused_run(in, o);
    EXPECT_EQ(fused.normed.sizes(), in.residual.sizes());
    ASSERT_TRUE(fused.d_weight.defined());
    EXPECT_TRUE(fused.d_weight.eq(0).all().item<bool>());
    EXPECT_TRUE(fused.d_bias.eq(0).all().item<bool>());
  }
}

// A whole model on the GPU in fp32 (the layers threading their pending adds into the next norm's
// kernel) against the same model run unfused (tests/models/unfused_model.h): logits and every parameter
// gradient within 1e-4 of the largest (the kernels sum in other orders than torch's norms). With
// hidden dropout: the masks are drawn in the same order. Without it the output projections leave
// their biases to the next norm (ResidualStream::branch_bias), whose pass sums their gradients.
TEST(GpuKernels, ModelsWithTheFusedResidualNormMatchTheUnfusedLayers) {
  REQUIRE_GPU();
  const std::vector<std::pair<std::string, std::vector<std::string>>> variants = {
      {"GPT", {"--hidden-dropout", "0.1", "--attention-dropout", "0"}},
      {"GPT without dropout", {"--hidden-dropout", "0", "--attention-dropout", "0"}},
      {"LLaMA-style", {"--hidden-dropout", "0", "--attention-dropout", "0", "--normalization", "RMSNorm",
                       "--apply-layernorm-1p", "--swiglu", "--position-embedding-type", "rope",
                       "--untie-embeddings-and-output-weights", "--disable-bias-linear"}},
  };
  for (const auto& [name, extra] : variants) {
    SCOPED_TRACE(name);
    auto args = tiny_args({"--num-layers", "3", "--hidden-size", "64"});
    args.insert(args.end(), extra.begin(), extra.end());
    const ModelConfig m = build(args).model;
    GptModel model(m);
    model->to(torch::kCUDA);
    model->train();
    torch::manual_seed(5);
    const auto tokens = torch::randint(0, m.vocab_size, {2, m.seq_length}, kCuda.dtype(torch::kLong));
    const auto upstream = torch::randn({2, m.seq_length, m.padded_vocab_size}, kCuda);
    const auto fused = logits_and_grads(*model, upstream, [&] { return model->forward(tokens); });
    const auto unfused = logits_and_grads(*model, upstream, [&] { return unfused_logits(*model, tokens); });
    EXPECT_LE(relative_error(fused.first, unfused.first), 1e-4);
    ASSERT_EQ(fused.second.size(), unfused.second.size());
    for (const auto& [p, g] : fused.second) EXPECT_LE(relative_error(g, unfused.second.at(p)), 1e-4) << p;
    // Whether a layer left its output projections' biases pending: only without dropout, and
    // only where the model has biases.
    auto& layer = module_named<TransformerLayerImpl>(*model, "decoder.layers.0");
    const auto x = torch::randn({m.seq_length, 2, m.hidden_size}, kCuda);
    const bool pending = m.hidden_dropout == 0 && m.add_bias_linear;
    EXPECT_EQ(layer.self_attention->forward_residual({x, {}}, {}, true).out_bias.defined(), m.add_bias_linear)
        << "linear_proj's bias";
    EXPECT_EQ(layer.forward_stream({x, {}}).branch_bias.defined(), pending) << "linear_fc2's bias";
  }
}

}  // namespace
}  // namespace fp8tron
