// FP8 attention (--fp8-dot-product-attention) on its emulated path: the casts around exact fp32
// products stay within FP8's error of exact attention, forward and backward, with grouped keys
// and values; the gradient scales follow the previous step's amaxes; runs train with it; the
// flag's rules.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "models/attention/fp8_attention.h"
#include "tests/identical_runs.h"
#include "tests/test_helpers.h"

namespace fp8tron {
namespace {

using testing::build;
using testing::tiny_args;
using testing::with;

constexpr int64_t kSeq = 32, kBatch = 2, kHeads = 4, kDim = 16;

std::shared_ptr<fp8::Fp8Engine> cpu_engine(fp8::Fp8Format format = fp8::Fp8Format::kHybrid) {
  fp8::Fp8EngineOptions o;
  o.recipe = fp8::make_recipe(fp8::RecipeKind::kDelayed, format);
  o.num_layers = 2;
  o.dot_product_attention = true;
  return std::make_shared<fp8::Fp8Engine>(o, torch::Device(torch::kCPU));
}

struct Inputs {
  torch::Tensor q, k, v, grad;
};

Inputs inputs(int64_t groups, uint64_t seed = 5) {
  torch::manual_seed(seed);
  return {torch::randn({kSeq, kBatch, kHeads, kDim}), torch::randn({kSeq, kBatch, groups, kDim}),
          torch::randn({kSeq, kBatch, groups, kDim}), torch::randn({kSeq, kBatch, kHeads * kDim})};
}

struct Result {
  torch::Tensor out, dq, dk, dv;
};

Result run_fp8(const Fp8Attention& attention, const Inputs& in) {
  auto q = in.q.clone().requires_grad_(true), k = in.k.clone().requires_grad_(true), v = in.v.clone().requires_grad_(true);
  auto out = attention.forward(q, k, v);
  out.backward(in.grad);
  return {out.detach(), q.grad(), k.grad(), v.grad()};
}

// Exact causal attention in fp32 through autograd.
Result run_exact(const Inputs& in, double scale) {
  auto q = in.q.clone().requires_grad_(true), k = in.k.clone().requires_grad_(true), v = in.v.clone().requires_grad_(true);
  const int64_t per_group = kHeads / in.k.size(2);
  auto bq = q.permute({1, 2, 0, 3}), bk = k.permute({1, 2, 0, 3}).repeat_interleave(per_group, 1),
       bv = v.permute({1, 2, 0, 3}).repeat_interleave(per_group, 1);
  auto out = at::scaled_dot_product_attention(bq, bk, bv, {}, 0.0, /*is_causal=*/true, scale);
  out = out.permute({2, 0, 1, 3}).reshape({kSeq, kBatch, kHeads * kDim});
  out.backward(in.grad);
  return {out.detach(), q.grad(), k.grad(), v.grad()};
}

double relative_error(const torch::Tensor& a, const torch::Tensor& b) {
  return ((a - b).norm() / b.norm()).item<double>();
}

TEST(Fp8Attention, EmulatedPassesStayWithinFp8ErrorOfExactAttention) {
  const double scale = 1.0 / std::sqrt(double(kDim));
  for (int64_t groups : {kHeads, int64_t(2)}) {
    SCOPED_TRACE(groups);
    auto engine = cpu_engine();
    auto site = engine->add_attention_site("decoder.layers.0.self_attention.core_attention", 0);
    ASSERT_TRUE(site);
    const Fp8Attention attention(engine, site, scale, kDim);
    const Inputs in = inputs(groups);
    // Two steps: the first calibrates the gradient scales, the second takes them delayed.
    run_fp8(attention, in);
    engine->end_step(nullptr, nullptr);
    const Result fp8 = run_fp8(attention, in), exact = run_exact(in, scale);
    // E4M3 keeps 3 mantissa bits (relative rounding error <= 1/16 per cast), E5M2 2 bits.
    EXPECT_LT(relative_error(fp8.out, exact.out), 0.06);
    EXPECT_GT(relative_error(fp8.out, exact.out), 1e-4) << "the output must be quantized";
    EXPECT_LT(relative_error(fp8.dq, exact.dq), 0.15);
    EXPECT_LT(relative_error(fp8.dk, exact.dk), 0.15);
    EXPECT_LT(relative_error(fp8.dv, exact.dv), 0.15);
    EXPECT_GT(relative_error(fp8.dq, exact.dq), 1e-4) << "the gradients must be quantized";
  }
}

TEST(Fp8Attention, GradientScalesComeFromThePreviousStepsAmaxes) {
  auto engine = cpu_engine();
  auto site = engine->add_attention_site("decoder.layers.1.self_attention.core_attention", 1);
  const Fp8Attention attention(engine, site, 0.25, kDim);
  const Inputs in = inputs(kHeads);
  // The first step calibrates: each backward pass takes the scales of its own amaxes.
  const Result first = run_fp8(attention, in);
  auto& scaling = engine->attention();
  EXPECT_FALSE(scaling.calibrated(*site));
  EXPECT_TRUE(torch::equal(scaling.amax(*site), torch::zeros({fp8::kAttentionAmaxes})));
  const auto seen = scaling.amax_now(*site).clone();
  // The amaxes recorded are those of the unquantized dQ, dK, dV and dP.
  const Result exact = run_exact(in, 0.25);
  EXPECT_NEAR(seen[fp8::kAmaxDQ].item<double>(), exact.dq.abs().max().item<double>(),
              0.15 * exact.dq.abs().max().item<double>());
  EXPECT_NEAR(seen[fp8::kAmaxDV].item<double>(), exact.dv.abs().max().item<double>(),
              0.15 * exact.dv.abs().max().item<double>());
  EXPECT_GT(seen[fp8::kAmaxDP].item<double>(), 0);
  engine->end_step(nullptr, nullptr);
  EXPECT_TRUE(scaling.calibrated(*site));
  EXPECT_TRUE(torch::equal(scaling.amax(*site), seen));
  EXPECT_TRUE(torch::equal(scaling.amax_now(*site), torch::zeros({fp8::kAttentionAmaxes})));
  // The same inputs again: the delayed scales are those the calibration took.
  const Result second = run_fp8(attention, in);
  EXPECT_TRUE(torch::equal(first.out, second.out));
  EXPECT_TRUE(torch::equal(first.dq, second.dq));
  EXPECT_TRUE(torch::equal(first.dv, second.dv));
  // Gradients eight times larger: cast with the previous step's scales, not their own.
  Inputs larger = in;
  larger.grad = in.grad * 8;
  const Result delayed = run_fp8(attention, larger);
  auto fresh = cpu_engine();
  const Fp8Attention calibrating(fresh, fresh->add_attention_site(site->name, 1), 0.25, kDim);
  const Result own = run_fp8(calibrating, larger);
  EXPECT_FALSE(torch::equal(delayed.dq, own.dq));
  // A checkpoint's state is the amax row; loading it gives the same scales.
  auto other = cpu_engine();
  auto other_site = other->add_attention_site(site->name, 1);
  EXPECT_FALSE(other->attention().calibrated(*other_site));
  other->attention().load_site_state(*other_site, scaling.site_state(*site));
  EXPECT_TRUE(torch::equal(other->attention().amax(*other_site), seen));
  EXPECT_TRUE(other->attention().calibrated(*other_site));
  EXPECT_USER_ERROR(other->attention().load_site_state(*other_site, torch::zeros({5})), "not 4");
}

TEST(Fp8Attention, LayersKeptInBf16RegisterNoSite) {
  fp8::Fp8EngineOptions o;
  o.recipe = fp8::make_recipe(fp8::RecipeKind::kTensorwise, fp8::Fp8Format::kE4M3);
  o.num_layers = 4;
  o.bf16_first_layers = 1;
  o.dot_product_attention = true;
  fp8::Fp8Engine engine(o, torch::Device(torch::kCPU));
  EXPECT_FALSE(engine.add_attention_site("decoder.layers.0.self_attention.core_attention", 0));
  EXPECT_TRUE(engine.add_attention_site("decoder.layers.1.self_attention.core_attention", 1));
  o.dot_product_attention = false;
  fp8::Fp8Engine off(o, torch::Device(torch::kCPU));
  EXPECT_FALSE(off.add_attention_site("decoder.layers.1.self_attention.core_attention", 1));
}

std::vector<std::string> fp8_attention_flags(std::vector<std::string> extra = {}) {
  return with({"--hidden-size", "64", "--attention-dropout", "0", "--fp8-format", "hybrid"}, extra);
}

TEST(Fp8Attention, RunsTrainWithIt) {
  const std::vector<std::vector<std::string>> models = {
      {},
      {"--swiglu", "--normalization", "RMSNorm", "--disable-bias-linear", "--position-embedding-type", "rope",
       "--group-query-attention", "--num-query-groups", "2"}};
  for (const auto& model : models) {
    for (const char* recipe : {"delayed", "tensorwise"}) {
      SCOPED_TRACE(std::string(recipe) + (model.empty() ? " gpt" : " llama-style"));
      const auto flags = fp8_attention_flags(with(model, {"--fp8-recipe", recipe}));
      const auto plain = testing::train_tiny_on_cpu(flags);
      const auto fp8 = testing::train_tiny_on_cpu(with(flags, {"--fp8-dot-product-attention"}));
      ASSERT_EQ(fp8.losses.size(), 4u);
      for (size_t i = 0; i < fp8.losses.size(); ++i) {
        EXPECT_NE(fp8.losses[i], plain.losses[i]) << "attention must run in FP8, iteration " << i + 1;
        EXPECT_NEAR(fp8.losses[i], plain.losses[i], 0.02 * plain.losses[i]) << "iteration " << i + 1;
      }
      const auto recomputed = testing::train_tiny_on_cpu(
          with(flags, {"--fp8-dot-product-attention", "--recompute-granularity", "selective", "--recompute-modules",
                       "core_attn"}));
      EXPECT_EQ(recomputed.losses, fp8.losses) << "recomputing the FP8 attention gives the same values";
    }
  }
}

TEST(Fp8Attention, FlagRules) {
  EXPECT_TRUE(build(with(tiny_args(), fp8_attention_flags({"--fp8-dot-product-attention"}))).precision.fp8.dot_product_attention);
  EXPECT_USER_ERROR(build(tiny_args({"--hidden-size", "64", "--fp8-format", "hybrid", "--fp8-dot-product-attention"})),
                    "add --attention-dropout 0");
  EXPECT_USER_ERROR(build(with(tiny_args(), fp8_attention_flags({"--fp8-dot-product-attention", "--fp8-format", "hif8", "--fp8-recipe", "tensorwise"}))),
                    "needs --fp8-format e4m3 or hybrid");
  EXPECT_USER_ERROR(build(with(tiny_args(), fp8_attention_flags({"--fp8-dot-product-attention", "--hidden-size", "32"}))),
                    "a multiple of 16");
  EXPECT_USER_ERROR(build(with(tiny_args(), fp8_attention_flags({"--fp8-dot-product-attention", "--reset-attention-mask"}))),
                    "drop --reset-attention-mask");
  EXPECT_USER_ERROR(build(with(tiny_args(), fp8_attention_flags({"--fp8-dot-product-attention", "--context-parallel-size", "2"})),
                          2),
                    "context parallelism");
  const Config mha = build(with(tiny_args(), fp8_attention_flags({"--fp8-multi-head-attention"})));
  ASSERT_FALSE(mha.not_supported_yet.empty());
  EXPECT_NE(mha.not_supported_yet.front().find("--fp8-multi-head-attention"), std::string::npos);
  const Config unused = build(tiny_args({"--hidden-size", "64", "--fp8-dot-product-attention"}));
  ASSERT_FALSE(unused.hint_warnings.empty());
  EXPECT_NE(unused.hint_warnings[0].find("--fp8-dot-product-attention has no effect without --fp8-format"),
            std::string::npos);
}

}  // namespace
}  // namespace fp8tron
