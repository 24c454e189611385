// --no-fp8-wgrad (Megatron's fp8_wgrad=False, Transformer Engine's override_linear_precision.wgrad):
// the weight gradient of an FP8 linear is the product of the unquantized output gradient and input,
// dW = dY^T f(x), for every prologue (none, GeLU, SwiGLU) and where the caller rebuilds x; the
// forward and the input gradient stay FP8, exactly those of the FP8-wgrad linear.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "fp8/fp8_linear.h"
#include "tests/identical_runs.h"
#include "tests/test_helpers.h"

namespace fp8tron {
namespace {

using testing::build;
using testing::tiny_args;
using testing::with;

constexpr int64_t kRows = 32, kIn = 64, kOut = 48;

std::shared_ptr<fp8::Fp8Engine> cpu_engine(bool fp8_wgrad) {
  fp8::Fp8EngineOptions o;
  o.recipe = fp8::make_recipe(fp8::RecipeKind::kDelayed, fp8::Fp8Format::kHybrid);
  o.num_layers = 4;
  o.fp8_wgrad = fp8_wgrad;
  return std::make_shared<fp8::Fp8Engine>(o, torch::Device(torch::kCPU));
}

struct Grads {
  torch::Tensor y, dx, dw, db;
};

// One linear with `prologue` (x is [rows, 2 in] for SwiGLU), its backward from `dy`.
Grads run(bool fp8_wgrad, fp8::Prologue prologue, const fp8::InputRebuild& rebuild = {}) {
  auto engine = cpu_engine(fp8_wgrad);
  auto site = engine->add_site("decoder.layers.1.mlp.linear_fc2", 1, kOut, kIn);
  torch::manual_seed(3);
  const int64_t width = prologue == fp8::Prologue::kSwiglu ? 2 * kIn : kIn;
  auto x = torch::randn({kRows, width}).requires_grad_(true);
  auto w = (torch::randn({kOut, kIn}) * 0.05).requires_grad_(true);
  auto b = (torch::randn({kOut}) * 0.1).requires_grad_(true);
  site->parameter = w;
  const auto dy = torch::randn({kRows, kOut});
  auto y = fp8::fp8_linear(x, w, b, *site, prologue, rebuild);
  y.backward(dy);
  return {y.detach(), x.grad(), w.grad(), b.grad()};
}

torch::Tensor activated(const torch::Tensor& x, fp8::Prologue prologue) {
  if (prologue == fp8::Prologue::kGeluTanh) return at::gelu(x, "tanh");
  if (prologue == fp8::Prologue::kSwiglu) return at::silu(x.narrow(1, 0, kIn)) * x.narrow(1, kIn, kIn);
  return x;
}

TEST(Fp8Wgrad, WeightGradientIsTheUnquantizedProduct) {
  for (auto prologue : {fp8::Prologue::kNone, fp8::Prologue::kGeluTanh, fp8::Prologue::kSwiglu}) {
    SCOPED_TRACE(int(prologue));
    const Grads fp8 = run(true, prologue), bf16 = run(false, prologue);
    // The same inputs again (seeded): the exact product the wgrad must give.
    torch::manual_seed(3);
    const auto x = torch::randn({kRows, prologue == fp8::Prologue::kSwiglu ? 2 * kIn : kIn});
    (void)torch::randn({kOut, kIn});
    (void)torch::randn({kOut});
    const auto dy = torch::randn({kRows, kOut});
    const auto exact = torch::mm(dy.t(), activated(x, prologue));
    EXPECT_TRUE(torch::equal(bf16.dw, exact)) << "the wgrad reads the unquantized dY and f(x)";
    EXPECT_FALSE(torch::allclose(fp8.dw, exact, 0, 1e-6)) << "the FP8 wgrad quantizes them";
    EXPECT_TRUE(torch::equal(bf16.y, fp8.y)) << "the forward pass is unchanged";
    EXPECT_TRUE(torch::equal(bf16.dx, fp8.dx)) << "the dgrad GEMM stays FP8";
    EXPECT_TRUE(torch::equal(bf16.db, fp8.db));
  }
}

// Where the caller can make the input again (a norm's output), the linear keeps nothing of it and
// calls the rebuild once, in backward.
TEST(Fp8Wgrad, RebuiltInputIsWhatTheWgradReads) {
  torch::manual_seed(3);
  const auto x = torch::randn({kRows, kIn});
  int calls = 0;
  const Grads bf16 = run(false, fp8::Prologue::kNone, [&] {
    ++calls;
    return x;
  });
  EXPECT_EQ(calls, 1);
  const Grads held = run(false, fp8::Prologue::kNone);
  EXPECT_TRUE(torch::equal(bf16.dw, held.dw));
}

TrainResult train_with(const std::vector<std::string>& extra) {
  return testing::train_tiny_on_cpu(with({"--fp8-format", "hybrid"}, extra));
}

// A run trains with bf16 weight gradients: the first step's forward is the FP8 run's, the
// updates differ, and recomputation and --fp8-transposes recast compose with it exactly.
TEST(Fp8Wgrad, RunsTrainWithBf16WeightGradients) {
  const std::vector<std::vector<std::string>> models = {
      {},
      {"--swiglu", "--normalization", "RMSNorm", "--disable-bias-linear", "--position-embedding-type", "rope"}};
  for (const auto& model : models) {
    for (const char* recipe : {"delayed", "blockwise"}) {
      SCOPED_TRACE(std::string(recipe) + (model.empty() ? " gpt" : " llama-style"));
      const auto flags = with(model, {"--fp8-recipe", recipe});
      const TrainResult fp8 = train_with(flags), bf16 = train_with(with(flags, {"--no-fp8-wgrad"}));
      ASSERT_EQ(bf16.losses.size(), 4u);
      EXPECT_EQ(bf16.losses[0], fp8.losses[0]);
      EXPECT_NE(bf16.losses[3], fp8.losses[3]) << "the weight gradients must differ from FP8's";
      for (double l : bf16.losses) EXPECT_TRUE(std::isfinite(l));
      const auto recomputed = train_with(with(flags, {"--no-fp8-wgrad", "--recompute-granularity", "full",
                                                      "--recompute-method", "uniform", "--recompute-num-layers", "1"}));
      EXPECT_EQ(recomputed.losses, bf16.losses);
      EXPECT_EQ(train_with(with(flags, {"--no-fp8-wgrad", "--fp8-transposes", "recast"})).losses, bf16.losses);
    }
  }
}

TEST(Fp8Wgrad, FlagRules) {
  EXPECT_FALSE(build(tiny_args({"--fp8-format", "hybrid", "--no-fp8-wgrad"})).precision.fp8.wgrad);
  EXPECT_FALSE(build(tiny_args({"--fp8-format", "hybrid", "--disable-fp8-wgrad"})).precision.fp8.wgrad);
  EXPECT_TRUE(build(tiny_args({"--fp8-format", "hybrid"})).precision.fp8.wgrad);
  const auto moe = tiny_args({"--fp8-format", "hybrid", "--no-fp8-wgrad", "--num-experts", "4", "--moe-grouped-gemm"});
  EXPECT_USER_ERROR(build(moe), "--no-fp8-wgrad is not supported yet for the MoE experts' FP8 grouped GEMMs");
  EXPECT_FALSE(build(with(moe, {"--no-use-gmm-fp8"})).precision.fp8.wgrad);
  const Config unused = build(tiny_args({"--no-fp8-wgrad"}));
  ASSERT_FALSE(unused.hint_warnings.empty());
  EXPECT_NE(unused.hint_warnings[0].find("--no-fp8-wgrad has no effect without --fp8-format"), std::string::npos);
}

}  // namespace
}  // namespace fp8tron
