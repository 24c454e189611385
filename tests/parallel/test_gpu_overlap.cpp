// GPU tests of the overlapped linear's FP8 GEMM functor (models/linear/linear_kernels_fp8.h) on one GPU
// (label gpu; skipped without a CUDA device): the communicating op over a group of one rank runs
// the native paths the CPU tests cannot (per-block cuBLASLt FP8 GEMMs, weight slices of the
// pipelined splits, the byte-transposed wgrad operand, the norm fused into the cast of the input
// shard, the SM budget, gradient-accumulation fusion into the main gradient) and must agree with
// fp8_linear / fp8_norm_linear to bf16 accuracy for every recipe with FP8 tensor cores. Several
// GPUs: tests/gpu_overlap_equivalence.sh.
#include <gtest/gtest.h>

#include <ATen/cuda/CUDAContext.h>

#include <cstdio>

#include "fp8/fp8_linear.h"
#include "fp8/recipe.h"
#include "models/linear/linear_kernels_fp8.h"
#include "parallel/overlap/tp_linear.h"
#include "parallel/parallel_state.h"

namespace fp8tron {
namespace {

#define REQUIRE_GPU() \
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device"

using M = OverlapMethod;

double relative(const torch::Tensor& a, const torch::Tensor& b) {
  return ((a.to(torch::kFloat32) - b.to(torch::kFloat32)).norm() / b.to(torch::kFloat32).norm().clamp_min(1e-12)).item<double>();
}

GemmOverlap how(M method, int splits = 4) {
  GemmOverlap g;
  g.method = method;
  g.num_splits = splits;
  g.sm_margin = method == M::kPipeline || method == M::kBulk;  // TE's defaults: exercise the SM budget
  g.num_sm = 16;
  return g;
}

struct Outputs {
  torch::Tensor y, dx, dw, db, dgamma;
};

void compare(const Outputs& want, const Outputs& got, const char* what) {
  double worst = 0;
  auto one = [&](const torch::Tensor& a, const torch::Tensor& b, const char* name) {
    if (!a.defined()) return;
    ASSERT_TRUE(b.defined()) << what << " " << name;
    const double r = relative(b, a);
    worst = std::max(worst, r);
    EXPECT_LT(r, 2e-2) << what << " " << name;
  };
  one(want.y, got.y, "y");
  one(want.dx, got.dx, "dx");
  one(want.dw, got.dw, "dW");
  one(want.db, got.db, "db");
  one(want.dgamma, got.dgamma, "dgamma");
  std::printf("[overlap-gpu] %s: worst relative difference %.2e\n", what, worst);
}


class OverlapGpu : public ::testing::TestWithParam<fp8::RecipeKind> {
 protected:
  void SetUp() override {
    if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
    const auto kind = GetParam();
    recipe_ = fp8::make_recipe(kind, kind == fp8::RecipeKind::kBlockwise ? fp8::Fp8Format::kE4M3 : fp8::Fp8Format::kHybrid);
    if (!fp8::runs_natively(*recipe_, at::cuda::getCurrentDeviceProperties()->major)) GTEST_SKIP() << "emulated here";
    tp_ = make_self_communicator("tp", 0);
  }
  std::shared_ptr<fp8::Fp8Site> site(fp8::Fp8Engine& e, int64_t out, int64_t in) { return e.add_site("site", -1, out, in); }

  // Column-parallel linear (2048 tokens, 512 -> 768, bias) through tp_linear with `plan` vs fp8_linear.
  void check_column(const overlap::TpLinearPlan& plan, const char* what) {
    const auto opts = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kBFloat16);
    torch::manual_seed(5);
    auto x0 = torch::randn({1024, 2, 512}, opts), w0 = torch::randn({768, 512}, opts) * 0.05, b0 = torch::randn({768}, opts);
    auto dy = torch::randn({1024, 2, 768}, opts) * 1e-2;
    auto run = [&](bool overlapped) {
      fp8::Fp8Engine e(fp8::Fp8EngineOptions{*recipe_}, torch::Device(torch::kCUDA, 0));
      auto s = site(e, 768, 512);
      auto x = x0.clone().requires_grad_(true), w = w0.clone().requires_grad_(true), b = b0.clone().requires_grad_(true);
      s->parameter = w;
      torch::Tensor y;
      if (overlapped) {
        auto k = std::make_shared<Fp8LinearKernels>(w, b, *s, *tp_, plan, fp8::Prologue::kNone);
        y = overlap::tp_linear(x, w, b, {}, k, plan, *tp_, 768);
      } else {
        y = fp8::fp8_linear(x, w, b, *s);
      }
      y.backward(dy);
      return Outputs{y.detach(), x.grad(), w.grad(), b.grad(), {}};
    };
    compare(run(false), run(true), what);
  }

  // Row-parallel (GeLU prologue, no bias) through tp_linear with `plan` vs fp8_linear.
  void check_row(const overlap::TpLinearPlan& plan, const char* what) {
    const auto opts = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kBFloat16);
    torch::manual_seed(6);
    auto x0 = torch::randn({1024, 2, 768}, opts), w0 = torch::randn({512, 768}, opts) * 0.05;
    auto dy = torch::randn({1024, 2, 512}, opts) * 1e-2;
    auto run = [&](bool overlapped) {
      fp8::Fp8Engine e(fp8::Fp8EngineOptions{*recipe_}, torch::Device(torch::kCUDA, 0));
      auto s = site(e, 512, 768);
      auto x = x0.clone().requires_grad_(true), w = w0.clone().requires_grad_(true);
      s->parameter = w;
      torch::Tensor y;
      if (overlapped) {
        auto k = std::make_shared<Fp8LinearKernels>(w, torch::Tensor(), *s, *tp_, plan, fp8::Prologue::kGeluTanh);
        y = overlap::tp_linear(x, w, {}, {}, k, plan, *tp_, 512);
      } else {
        y = fp8::fp8_linear(x, w, {}, *s, fp8::Prologue::kGeluTanh);
      }
      y.backward(dy);
      return Outputs{y.detach(), x.grad(), w.grad(), {}, {}};
    };
    compare(run(false), run(true), what);
  }

  std::optional<fp8::Recipe> recipe_;
  std::shared_ptr<Communicator> tp_;
};

TEST_P(OverlapGpu, ColumnMethods) {
  check_column({true, how(M::kRingExchange), how(M::kBulk), how(M::kBulk)}, "column ring + bulk");
  check_column({true, how(M::kPipeline, 2), how(M::kOff), how(M::kOff)}, "column CoC pieces");
  check_column({true, how(M::kRingExchange), how(M::kPipeline, 2), how(M::kOff)}, "column rs-dgrad pipeline (weight column splits)");
  check_column({true, how(M::kOff), how(M::kRingExchange), how(M::kOff)}, "column rs-dgrad ring");
}

TEST_P(OverlapGpu, RowMethods) {
  check_row({false, how(M::kPipeline, 2), how(M::kRingExchange), GemmOverlap{}}, "row pipeline (weight row splits) + ring");
  check_row({false, how(M::kRingExchange), how(M::kPipeline, 2), GemmOverlap{}}, "row ring reduce-scatter + CoC dgrad");
}

INSTANTIATE_TEST_SUITE_P(Recipes, OverlapGpu,
                         ::testing::Values(fp8::RecipeKind::kDelayed, fp8::RecipeKind::kTensorwise, fp8::RecipeKind::kBlockwise),
                         [](const auto& info) { return std::string(fp8::recipe_kind_name(info.param)); });

// The norm fused into the cast of the shard (now under tensor parallelism): tp_linear with the
// norm's parameters as extra inputs vs fp8_norm_linear, LayerNorm and RMSNorm; and the wgrad into
// an fp32 main gradient the way the optimizer arranges it.
TEST(OverlapGpuNorm, FusedNormCastAndMainGradient) {
  REQUIRE_GPU();
  const auto recipe = fp8::make_recipe(fp8::RecipeKind::kDelayed, fp8::Fp8Format::kHybrid);
  if (!fp8::runs_natively(recipe, at::cuda::getCurrentDeviceProperties()->major)) GTEST_SKIP() << "emulated here";
  auto tp = make_self_communicator("tp", 0);
  const auto opts = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kBFloat16);
  const overlap::TpLinearPlan plan{true, how(M::kRingExchange), how(M::kBulk), how(M::kBulk)};
  for (bool rms : {false, true}) {
    torch::manual_seed(7);
    auto x0 = torch::randn({512, 2, 512}, opts), w0 = torch::randn({768, 512}, opts) * 0.05;
    auto g0 = torch::rand({512}, opts) + 0.5, beta0 = torch::randn({512}, opts) * 0.1, b0 = torch::randn({768}, opts);
    auto dy = torch::randn({512, 2, 768}, opts) * 1e-2;
    auto run = [&](bool overlapped) {
      fp8::Fp8Engine e(fp8::Fp8EngineOptions{recipe}, torch::Device(torch::kCUDA, 0));
      auto s = e.add_site("site", -1, 768, 512);
      auto x = x0.clone().requires_grad_(true), w = w0.clone().requires_grad_(true), b = b0.clone().requires_grad_(true);
      auto g = g0.clone().requires_grad_(true);
      auto beta = rms ? torch::Tensor() : beta0.clone().requires_grad_(true);
      s->parameter = w;
      w.mutable_grad() = torch::zeros({768, 512}, opts.dtype(torch::kFloat32));  // main gradient: wgrad accumulates into it
      torch::Tensor y;
      if (overlapped) {
        EXPECT_TRUE(fused_norm_cast_available(*s, x, g, beta));
        auto k = std::make_shared<Fp8LinearKernels>(w, b, *s, *tp, plan, fp8::Prologue::kNone);
        k->fuse_norm(rms, g, beta, 1e-5, false);
        std::vector<torch::Tensor> extra = {g};
        if (beta.defined()) extra.push_back(beta);
        y = overlap::tp_linear(x, w, b, extra, k, plan, *tp, 768);
      } else {
        y = fp8::fp8_norm_linear(x, rms, g, beta, 1e-5, false, w, b, *s);
      }
      y.backward(dy);
      return Outputs{y.detach(), x.grad(), w.grad().clone(), b.grad(), g.grad()};
    };
    compare(run(false), run(true), rms ? "fused RMSNorm cast under the op" : "fused LayerNorm cast under the op");
  }
}

}  // namespace
}  // namespace fp8tron
