// The FP8 linear layer on the CPU path: forward and backward against an independent emulation
// (fake quantization with formats.h), delayed-scaling updates (scales, interval, history),
// weight caching per optimizer step, recipe state round trips, and which layers stay bf16.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

#include "fp8/fp8_linear.h"
#include "fp8/formats.h"
#include "tests/test_helpers.h"

namespace fp8tron {
namespace {
using fp8::Format;

constexpr int64_t kRows = 32, kIn = 64, kOut = 48;

std::shared_ptr<fp8::Fp8Engine> cpu_engine(const fp8::Recipe& recipe, int64_t min_features = 0) {
  fp8::Fp8EngineOptions o;
  o.recipe = recipe;
  o.min_features = min_features;
  o.num_layers = 4;
  return std::make_shared<fp8::Fp8Engine>(o, torch::Device(torch::kCPU));
}

fp8::Recipe recipe_of(fp8::RecipeKind kind, fp8::Fp8Format format) { return fp8::make_recipe(kind, format); }

// The quantizers read bf16: the oracle starts from the same rounded values.
torch::Tensor bf16_values(const torch::Tensor& x) { return x.to(torch::kBFloat16).to(torch::kFloat32); }

float amax_of(const torch::Tensor& x) { return bf16_values(x).abs().max().item<float>(); }

// decode(encode(x * scale)) / scale, element by element (formats.h), in fp32.
torch::Tensor fake_quantize(const torch::Tensor& x, Format format, float scale) {
  auto in = bf16_values(x).contiguous();
  auto out = torch::empty_like(in);
  fp8::fake_quantize(format, in.data_ptr<float>(), size_t(in.numel()), scale, out.data_ptr<float>());
  return out;
}

// Current (tensorwise) scaling: scale = fp8_max / amax.
torch::Tensor current_fake_quantize(const torch::Tensor& x, Format format) {
  return fake_quantize(x, format, fp8::max_finite(format) / amax_of(x));
}

struct Inputs {
  torch::Tensor x, w, b;
};
Inputs random_inputs(uint64_t seed) {
  torch::manual_seed(seed);
  Inputs in;
  in.x = torch::randn({kRows, kIn}).requires_grad_(true);
  in.w = (torch::randn({kOut, kIn}) * 0.05).requires_grad_(true);
  in.b = (torch::randn({kOut}) * 0.1).requires_grad_(true);
  return in;
}

double relative_error(const torch::Tensor& a, const torch::Tensor& b) {
  return ((a - b).norm() / b.norm()).item<double>();
}

TEST(Fp8Linear, TensorwiseForwardAndBackwardMatchTheEmulation) {
  for (auto format : {fp8::Fp8Format::kE4M3, fp8::Fp8Format::kHybrid, fp8::Fp8Format::kHiF8}) {
    SCOPED_TRACE(fp8::fp8_format_name(format));
    auto engine = cpu_engine(recipe_of(fp8::RecipeKind::kTensorwise, format));
    auto site = engine->add_site("decoder.layers.1.mlp.linear_fc1", 1, kOut, kIn);
    ASSERT_TRUE(site);
    auto in = random_inputs(1);
    auto y = fp8::fp8_linear(in.x, in.w, in.b, *site);
    auto dy = torch::randn({kRows, kOut}) * 1e-3;
    y.backward(dy);

    const Format fwd = fp8::tensor_format(engine->recipe(), fp8::TensorRole::kInput);
    const Format bwd = fp8::tensor_format(engine->recipe(), fp8::TensorRole::kGradOutput);
    auto xq = current_fake_quantize(in.x.detach(), fwd), wq = current_fake_quantize(in.w.detach(), fwd);
    auto dyq = current_fake_quantize(dy, bwd);
    EXPECT_LT(relative_error(y.detach(), torch::addmm(in.b.detach(), xq, wq.t())), 1e-6);
    EXPECT_LT(relative_error(in.x.grad(), torch::mm(dyq, wq)), 1e-6);
    EXPECT_LT(relative_error(in.w.grad(), torch::mm(dyq.t(), xq)), 1e-6);
    EXPECT_LT(relative_error(in.b.grad(), dy.sum(0)), 1e-6);
    // And FP8 is close to the exact product (E4M3 / HiF8 / E5M2 rounding).
    auto exact = torch::addmm(in.b.detach(), in.x.detach(), in.w.detach().t());
    // HiF8 scaled to its max (32768) keeps 1-2 mantissa bits for the large values.
    EXPECT_LT(relative_error(y.detach(), exact), format == fp8::Fp8Format::kHiF8 ? 0.2 : 0.08);
  }
}

TEST(Fp8Linear, GeluPrologueIsTheLinearOfTheGelu) {
  for (auto kind : {fp8::RecipeKind::kTensorwise, fp8::RecipeKind::kMxfp8}) {
    auto engine = cpu_engine(recipe_of(kind, fp8::Fp8Format::kHybrid));
    auto site = engine->add_site("decoder.layers.1.mlp.linear_fc2", 1, kOut, kIn);
    auto in = random_inputs(9);
    auto dy = torch::randn({kRows, kOut});
    auto fused = fp8::fp8_linear(in.x, in.w, {}, *site, fp8::Prologue::kGeluTanh);
    fused.backward(dy);
    auto dx_fused = in.x.grad().clone(), dw_fused = in.w.grad().clone();
    in.x.grad().zero_();
    in.w.grad().zero_();
    auto plain = fp8::fp8_linear(at::gelu(in.x, "tanh"), in.w, {}, *site);
    plain.backward(dy);
    EXPECT_TRUE(torch::equal(fused, plain));
    EXPECT_TRUE(torch::allclose(dx_fused, in.x.grad(), 1e-6, 1e-7));
    EXPECT_TRUE(torch::equal(dw_fused, in.w.grad()));
  }
}

TEST(Fp8Linear, MlpWithDeferredGeluBackwardMatchesTheUnfusedChain) {
  auto engine = cpu_engine(recipe_of(fp8::RecipeKind::kDelayed, fp8::Fp8Format::kHybrid));
  auto fc1 = engine->add_site("decoder.layers.1.mlp.linear_fc1", 1, kOut, kIn);
  auto fc2 = engine->add_site("decoder.layers.1.mlp.linear_fc2", 1, kIn, kOut);
  auto in = random_inputs(11);
  auto w2 = (torch::randn({kIn, kOut}) * 0.05).requires_grad_(true);
  auto b2 = torch::zeros({kIn}).requires_grad_(true);
  auto dy = torch::randn({kRows, kIn});
  auto run = [&](bool fused) {
    for (auto* t : {&in.x, &in.w, &in.b, &w2, &b2})
      if (t->grad().defined()) t->grad().zero_();
    auto h = fp8::fp8_linear(in.x, in.w, in.b, *fc1);
    auto y = fused ? fp8::fp8_linear(h, w2, b2, *fc2, fp8::Prologue::kGeluTanh)
                   : fp8::fp8_linear(at::gelu(h, "tanh"), w2, b2, *fc2);
    y.backward(dy);
    return std::vector<torch::Tensor>{y.detach(), in.x.grad().clone(), in.w.grad().clone(), in.b.grad().clone(),
                                      w2.grad().clone(), b2.grad().clone()};
  };
  auto fused = run(true), plain = run(false);
  for (size_t i = 0; i < fused.size(); ++i) EXPECT_TRUE(torch::allclose(fused[i], plain[i], 1e-5, 1e-7)) << "output " << i;
}

TEST(Fp8Linear, LayerNormLinearIsTheLinearOfTheNorm) {
  // On the CPU (and for recipes without the fused cast) it is layer_norm then fp8_linear; the
  // gradients reach gamma and beta (zero-centred gamma: stored as gamma - 1).
  auto engine = cpu_engine(recipe_of(fp8::RecipeKind::kDelayed, fp8::Fp8Format::kHybrid));
  auto site = engine->add_site("decoder.layers.1.self_attention.linear_qkv", 1, kOut, kIn);
  auto in = random_inputs(12);
  auto gamma = (torch::randn({kIn}) * 0.1).requires_grad_(true), beta = torch::randn({kIn}).requires_grad_(true);
  auto dy = torch::randn({kRows, kOut});
  fp8::fp8_norm_linear(in.x, false, gamma, beta, 1e-5, true, in.w, in.b, *site).backward(dy);
  auto grads = std::vector<torch::Tensor>{in.x.grad().clone(), gamma.grad().clone(), beta.grad().clone(), in.w.grad().clone()};
  for (auto* t : {&in.x, &gamma, &beta, &in.w, &in.b}) t->grad().zero_();
  fp8::fp8_linear(at::layer_norm(in.x, {kIn}, gamma + 1, beta, 1e-5), in.w, in.b, *site).backward(dy);
  EXPECT_TRUE(torch::equal(grads[0], in.x.grad()));
  EXPECT_TRUE(torch::equal(grads[1], gamma.grad()));
  EXPECT_TRUE(torch::equal(grads[2], beta.grad()));
  EXPECT_TRUE(torch::equal(grads[3], in.w.grad()));
  EXPECT_GT(gamma.grad().abs().sum().item<float>(), 0.0f);
}

TEST(Fp8Linear, SwigluPrologueIsTheLinearOfTheSwiglu) {
  auto engine = cpu_engine(recipe_of(fp8::RecipeKind::kDelayed, fp8::Fp8Format::kHybrid));
  auto site = engine->add_site("decoder.layers.1.mlp.linear_fc2", 1, kOut, kIn);
  torch::manual_seed(21);
  auto h = torch::randn({kRows, 2 * kIn}).requires_grad_(true);
  auto w = (torch::randn({kOut, kIn}) * 0.05).requires_grad_(true);
  auto dy = torch::randn({kRows, kOut});
  auto fused = fp8::fp8_linear(h, w, {}, *site, fp8::Prologue::kSwiglu);
  fused.backward(dy);
  auto dh = h.grad().clone(), dw = w.grad().clone();
  h.grad().zero_();
  w.grad().zero_();
  auto halves = h.chunk(2, -1);
  auto plain = fp8::fp8_linear(at::silu(halves[0]) * halves[1], w, {}, *site);
  plain.backward(dy);
  EXPECT_TRUE(torch::equal(fused, plain));
  EXPECT_TRUE(torch::allclose(dh, h.grad(), 1e-6, 1e-7));
  EXPECT_TRUE(torch::equal(dw, w.grad()));
}

// fc1 -> SwiGLU -> fc2 in bf16: fc2 hands SwiGLU's backward to fc1's node (on GPUs fused into
// fc1's gradient cast, here computed by fc1's node); every gradient equals the chain's where fc2
// applies it itself (a view between the two linears stops the hand-over).
TEST(Fp8Linear, SwigluBackwardHandedToFc1IsTheSameGradient) {
  auto engine = cpu_engine(recipe_of(fp8::RecipeKind::kDelayed, fp8::Fp8Format::kHybrid));
  auto fc1 = engine->add_site("decoder.layers.1.mlp.linear_fc1", 1, 2 * kIn, kOut);
  auto fc2 = engine->add_site("decoder.layers.1.mlp.linear_fc2", 1, kOut, kIn);
  torch::manual_seed(22);
  const auto bf16 = torch::TensorOptions().dtype(torch::kBFloat16);
  auto x = torch::randn({kRows, kOut}, bf16).requires_grad_(true);
  auto w1 = (torch::randn({2 * kIn, kOut}, bf16) * 0.1).requires_grad_(true), b1 = torch::randn({2 * kIn}, bf16).requires_grad_(true);
  auto w2 = (torch::randn({kOut, kIn}, bf16) * 0.1).requires_grad_(true);
  auto dy = torch::randn({kRows, kOut}, bf16);
  auto run = [&](bool hand_over) {
    for (auto* t : {&x, &w1, &b1, &w2}) t->mutable_grad() = torch::Tensor();
    auto h = fp8::fp8_linear(x, w1, b1, *fc1);
    if (!hand_over) h = h.view(h.sizes());
    auto y = fp8::fp8_linear(h, w2, {}, *fc2, fp8::Prologue::kSwiglu);
    EXPECT_EQ(fp8::hands_over_swiglu_backward(h), hand_over);
    y.backward(dy);
    return std::vector<torch::Tensor>{y.detach(), x.grad(), w1.grad(), b1.grad(), w2.grad()};
  };
  auto handed = run(true), plain = run(false);
  const char* names[] = {"y", "dx", "dw1", "db1", "dw2"};
  for (size_t i = 0; i < handed.size(); ++i) EXPECT_TRUE(torch::equal(handed[i], plain[i])) << names[i];
  EXPECT_GT(x.grad().abs().sum().item<float>(), 0.0f);
}

TEST(Fp8Linear, BlockAndMxRecipesAreCloseToTheExactProduct) {
  for (auto [kind, format] : {std::pair{fp8::RecipeKind::kBlockwise, fp8::Fp8Format::kE4M3},
                              std::pair{fp8::RecipeKind::kBlockwise, fp8::Fp8Format::kHybrid},
                              std::pair{fp8::RecipeKind::kMxfp8, fp8::Fp8Format::kE4M3},
                              std::pair{fp8::RecipeKind::kMxfp8, fp8::Fp8Format::kHybrid}}) {
    SCOPED_TRACE(fp8::describe(recipe_of(kind, format)));
    auto engine = cpu_engine(recipe_of(kind, format));
    auto site = engine->add_site("decoder.layers.0.self_attention.linear_qkv", 0, kOut, kIn);
    auto in = random_inputs(2);
    auto y = fp8::fp8_linear(in.x, in.w, in.b, *site);
    auto dy = torch::randn({kRows, kOut});
    y.backward(dy);
    const double bound = format == fp8::Fp8Format::kHybrid ? 0.15 : 0.08;  // E5M2 gradients: 2 mantissa bits
    EXPECT_LT(relative_error(y.detach(), torch::addmm(in.b.detach(), in.x.detach(), in.w.detach().t())), 0.08);
    EXPECT_LT(relative_error(in.x.grad(), torch::mm(dy, in.w.detach())), bound);
    EXPECT_LT(relative_error(in.w.grad(), torch::mm(dy.t(), in.x.detach())), bound);
    EXPECT_GT(relative_error(in.x.grad(), torch::mm(dy, in.w.detach())), 0.0);  // really quantized
  }
}

// Transformer Engine's Float8BlockScaling with power-of-two scales: each tile (1 x 128 runs of a
// row, or 128 x 128 blocks) gets 2^floor(log2(max / amax)); all-zero tiles scale by 1.
torch::Tensor block_fake_quantize(const torch::Tensor& x, Format format, int64_t tile_rows, int64_t tile_cols) {
  auto out = torch::empty_like(x);
  for (int64_t r = 0; r < x.size(0); r += tile_rows) {
    for (int64_t c = 0; c < x.size(1); c += tile_cols) {
      auto tile = x.slice(0, r, std::min(r + tile_rows, x.size(0))).slice(1, c, std::min(c + tile_cols, x.size(1)));
      const float amax = amax_of(tile);
      const float scale = amax > 0 ? std::ldexp(1.0f, std::ilogb(fp8::max_finite(format) / amax)) : 1.0f;
      out.slice(0, r, r + tile.size(0)).slice(1, c, c + tile.size(1)).copy_(fake_quantize(tile, format, scale));
    }
  }
  return out;
}

// --fp8-format hybrid --fp8-recipe blockwise (Transformer Engine allows it; Megatron passes it on):
// the forward casts inputs (1x128) and weights (128x128) to E4M3, the backward casts the output
// gradient (1x128 along each GEMM's reduction) to E5M2. Against that emulation, and not E4M3
// gradients (what --fp8-format e4m3 gives).
TEST(Fp8Linear, BlockwiseHybridCastsGradientsToE5M2) {
  auto engine = cpu_engine(recipe_of(fp8::RecipeKind::kBlockwise, fp8::Fp8Format::kHybrid));
  auto site = engine->add_site("decoder.layers.1.mlp.linear_fc1", 1, kOut, kIn);
  ASSERT_TRUE(site);
  auto in = random_inputs(5);
  auto y = fp8::fp8_linear(in.x, in.w, in.b, *site);
  auto dy = torch::randn({kRows, kOut}) * 1e-3;
  y.backward(dy);

  const auto x = in.x.detach(), w = in.w.detach();
  auto wq = block_fake_quantize(w, Format::kE4M3, 128, 128);
  auto xq_rows = block_fake_quantize(x, Format::kE4M3, 1, 128);    // forward: tiles along K
  auto xq_cols = block_fake_quantize(x, Format::kE4M3, 128, 1);    // wgrad: tiles along the tokens
  auto grad_rows = [&](Format f) { return block_fake_quantize(dy, f, 1, 128); };
  auto grad_cols = [&](Format f) { return block_fake_quantize(dy, f, 128, 1); };
  EXPECT_LT(relative_error(y.detach(), torch::addmm(in.b.detach(), xq_rows, wq.t())), 1e-5);
  EXPECT_LT(relative_error(in.x.grad(), torch::mm(grad_rows(Format::kE5M2), wq)), 1e-5);
  EXPECT_LT(relative_error(in.w.grad(), torch::mm(grad_cols(Format::kE5M2).t(), xq_cols)), 1e-5);
  // E4M3 gradients would be a different computation (one more mantissa bit): far outside 1e-5.
  EXPECT_GT(relative_error(in.x.grad(), torch::mm(grad_rows(Format::kE4M3), wq)), 1e-3);
}

TEST(Fp8Linear, BlockScalesFollowTheBlocks) {
  // One huge row block: with per-tensor scaling it would flush the small values to zero; 1x128
  // tiles keep them.
  auto engine = cpu_engine(recipe_of(fp8::RecipeKind::kBlockwise, fp8::Fp8Format::kE4M3));
  auto site = engine->add_site("decoder.layers.0.mlp.linear_fc2", 0, kOut, kIn);
  auto in = random_inputs(3);
  auto x = in.x.detach().clone();
  x[0] *= 1e6;
  auto y = fp8::fp8_linear(x, in.w.detach(), {}, *site);
  auto exact = torch::mm(x, in.w.detach().t());
  EXPECT_LT(relative_error(y.slice(0, 1), exact.slice(0, 1)), 0.08);
}

TEST(Fp8Linear, DelayedScalingUsesLastStepsAmaxes) {
  auto engine = cpu_engine(recipe_of(fp8::RecipeKind::kDelayed, fp8::Fp8Format::kHybrid));
  auto site = engine->add_site("decoder.layers.2.self_attention.linear_proj", 2, kOut, kIn);
  auto in = random_inputs(4);
  // Step 1: scales start at 1.
  auto y = fp8::fp8_linear(in.x, in.w, in.b, *site);
  auto dy = torch::randn({kRows, kOut}) * 1e-2;
  y.backward(dy);
  EXPECT_LT(relative_error(y.detach(), torch::addmm(in.b.detach(), fake_quantize(in.x.detach(), Format::kE4M3, 1.0f),
                                                   fake_quantize(in.w.detach(), Format::kE4M3, 1.0f).t())),
            1e-6);
  engine->end_step(nullptr);
  const auto scale = engine->scale();
  EXPECT_FLOAT_EQ(scale[int64_t(engine->slot(*site, fp8::TensorRole::kInput))].item<float>(), 448.0f / amax_of(in.x.detach()));
  EXPECT_FLOAT_EQ(scale[int64_t(engine->slot(*site, fp8::TensorRole::kWeight))].item<float>(), 448.0f / amax_of(in.w.detach()));
  EXPECT_FLOAT_EQ(scale[int64_t(engine->slot(*site, fp8::TensorRole::kGradOutput))].item<float>(), 57344.0f / amax_of(dy));
  // Step 2 quantizes with those scales.
  auto x2 = in.x.detach() * 0.5;
  auto y2 = fp8::fp8_linear(x2, in.w.detach(), {}, *site);
  auto xq = fake_quantize(x2, Format::kE4M3, 448.0f / amax_of(in.x.detach()));
  auto wq = fake_quantize(in.w.detach(), Format::kE4M3, 448.0f / amax_of(in.w.detach()));
  EXPECT_LT(relative_error(y2, torch::mm(xq, wq.t())), 1e-6);
}

TEST(Fp8Linear, DelayedScalingIntervalAndHistoryMax) {
  auto recipe = fp8::make_recipe(fp8::RecipeKind::kDelayed, fp8::Fp8Format::kHybrid, /*margin=*/1, /*interval=*/2,
                                 /*history=*/3, fp8::AmaxComputeAlgo::kMax);
  auto engine = cpu_engine(recipe);
  auto site = engine->add_site("decoder.layers.1.mlp.linear_fc2", 1, kOut, kIn);
  auto w = torch::randn({kOut, kIn}).requires_grad_(true);
  const int64_t input = int64_t(engine->slot(*site, fp8::TensorRole::kInput));
  auto step = [&](float magnitude) {
    auto x = torch::full({kRows, kIn}, magnitude).requires_grad_(true);
    fp8::fp8_linear(x, w, {}, *site).sum().backward();
    engine->end_step(nullptr);
    return engine->scale()[input].item<float>();
  };
  EXPECT_EQ(step(4.0f), 1.0f);                  // first step of the interval: no update yet
  EXPECT_EQ(step(2.0f), 448.0f / 4.0f / 2.0f);  // max over the interval, margin 1
  EXPECT_EQ(step(1.0f), 448.0f / 4.0f / 2.0f);
  EXPECT_EQ(step(1.0f), 448.0f / 4.0f / 2.0f);  // history (len 3) still holds the 4
  EXPECT_EQ(step(1.0f), 448.0f / 4.0f / 2.0f);
  EXPECT_EQ(step(1.0f), 448.0f / 4.0f / 2.0f);
  EXPECT_EQ(step(1.0f), 448.0f / 4.0f / 2.0f);
  EXPECT_EQ(step(1.0f), 448.0f / 1.0f / 2.0f);  // the 4 left the history
}

TEST(Fp8Linear, WeightIsQuantizedOncePerOptimizerStep) {
  auto engine = cpu_engine(recipe_of(fp8::RecipeKind::kTensorwise, fp8::Fp8Format::kHybrid));
  auto site = engine->add_site("decoder.layers.1.mlp.linear_fc1", 1, kOut, kIn);
  auto in = random_inputs(5);
  fp8::fp8_linear(in.x, in.w, in.b, *site).sum().backward();
  auto first = site->weight;
  fp8::fp8_linear(in.x, in.w, in.b, *site).sum().backward();  // second micro-batch
  EXPECT_EQ(site->weight, first);
  {
    torch::NoGradGuard no_grad;
    in.w.add_(1.0);  // the optimizer updates the weight
  }
  engine->end_step(nullptr);
  auto y = fp8::fp8_linear(in.x, in.w, in.b, *site);
  EXPECT_NE(site->weight, first);
  EXPECT_LT(relative_error(y.detach(), torch::addmm(in.b.detach(), in.x.detach(), in.w.detach().t())), 0.08);
}

TEST(Fp8Linear, EvaluationDoesNotMoveDelayedScales) {
  auto engine = cpu_engine(recipe_of(fp8::RecipeKind::kDelayed, fp8::Fp8Format::kHybrid));
  auto site = engine->add_site("decoder.layers.1.mlp.linear_fc1", 1, kOut, kIn);
  auto in = random_inputs(6);
  {
    torch::NoGradGuard no_grad;
    fp8::fp8_linear(in.x * 100, in.w, in.b, *site);
  }
  engine->end_step(nullptr);
  EXPECT_EQ(engine->scale()[int64_t(engine->slot(*site, fp8::TensorRole::kInput))].item<float>(), 1.0f);
}

TEST(Fp8Linear, RecipeStateRoundTrip) {
  auto recipe = fp8::make_recipe(fp8::RecipeKind::kDelayed, fp8::Fp8Format::kHybrid, 0, 1, 4, fp8::AmaxComputeAlgo::kMax);
  auto engine = cpu_engine(recipe);
  auto a = engine->add_site("decoder.layers.0.mlp.linear_fc1", 0, kOut, kIn);
  auto b = engine->add_site("decoder.layers.0.mlp.linear_fc2", 0, kIn, kOut);
  for (int i = 0; i < 3; ++i) {
    auto x = (torch::randn({kRows, kIn}) * (i + 1)).requires_grad_(true);
    auto w1 = torch::randn({kOut, kIn}).requires_grad_(true), w2 = torch::randn({kIn, kOut}).requires_grad_(true);
    fp8::fp8_linear(fp8::fp8_linear(x, w1, {}, *a), w2, {}, *b).sum().backward();
    engine->end_step(nullptr);
  }
  auto restored = cpu_engine(recipe);
  auto a2 = restored->add_site("decoder.layers.0.mlp.linear_fc1", 0, kOut, kIn);
  auto b2 = restored->add_site("decoder.layers.0.mlp.linear_fc2", 0, kIn, kOut);
  restored->load_site_state(*b2, engine->site_state(*b));
  restored->load_site_state(*a2, engine->site_state(*a));
  EXPECT_EQ(restored->steps(), 3u);
  EXPECT_TRUE(torch::equal(restored->history(), engine->history()));
  EXPECT_TRUE(torch::equal(restored->scale(), engine->scale()));
  EXPECT_TRUE(torch::equal(restored->scale_inv(), engine->scale_inv()));
  EXPECT_USER_ERROR(restored->load_site_state(*a2, torch::zeros({7})), "not a delayed-scaling state");
}

TEST(Fp8Linear, SmallAndEdgeLayersStayBf16) {
  fp8::Fp8EngineOptions o;
  o.recipe = recipe_of(fp8::RecipeKind::kDelayed, fp8::Fp8Format::kHybrid);
  o.min_features = 64;
  o.bf16_first_layers = 1;
  o.bf16_last_layers = 1;
  o.num_layers = 4;
  fp8::Fp8Engine engine(o, torch::Device(torch::kCPU));
  EXPECT_FALSE(engine.add_site("decoder.layers.0.mlp.linear_fc1", 0, 128, 128));  // first layer
  EXPECT_FALSE(engine.add_site("decoder.layers.3.mlp.linear_fc1", 3, 128, 128));  // last layer
  EXPECT_FALSE(engine.add_site("decoder.layers.1.mlp.linear_fc1", 1, 128, 48));   // below the threshold
  EXPECT_FALSE(engine.add_site("decoder.layers.1.mlp.linear_fc2", 1, 72, 128));   // not a multiple of 16
  EXPECT_TRUE(engine.add_site("decoder.layers.2.mlp.linear_fc1", 2, 128, 64));
  EXPECT_EQ(engine.num_sites(), 1u);
  EXPECT_NE(engine.describe().find("4 kept in bf16"), std::string::npos) << engine.describe();
}

TEST(Fp8Linear, TokensMustBeAMultipleOf16) {
  auto engine = cpu_engine(recipe_of(fp8::RecipeKind::kTensorwise, fp8::Fp8Format::kHybrid));
  auto site = engine->add_site("decoder.layers.1.mlp.linear_fc1", 1, kOut, kIn);
  EXPECT_USER_ERROR(fp8::fp8_linear(torch::randn({20, kIn}), torch::randn({kOut, kIn}), {}, *site), "multiple of 16");
}

TEST(Fp8Flags, RulesAreEnforcedWithClearErrors) {
  using testing::build;
  using testing::tiny_args;
  EXPECT_USER_ERROR(build(tiny_args({"--fp8-format", "hif8", "--fp8-recipe", "delayed"})), "requires --fp8-recipe tensorwise");
  EXPECT_NO_THROW(build(tiny_args({"--fp8-format", "hybrid", "--fp8-recipe", "blockwise"})));
  EXPECT_USER_ERROR(build(tiny_args({"--fp8-format", "hif8", "--fp8-recipe", "blockwise"})), "requires --fp8-recipe tensorwise");
  EXPECT_USER_ERROR(build(tiny_args({"--fp8-format", "hybrid", "--transformer-impl", "local"})),
                    "--transformer-impl transformer_engine");
  EXPECT_USER_ERROR(build(tiny_args({"--fp8-format", "e4m3", "--fp8-recipe", "delayd"})), "delayed");
  EXPECT_USER_ERROR(build(tiny_args({"--fp8-format", "hybrid", "--first-last-layers-bf16", "--num-layers-at-start-in-bf16", "2",
                                     "--num-layers-at-end-in-bf16", "1"})),
                    "exceed --num-layers");
  const Config c = build(tiny_args({"--fp8-format", "hybrid", "--fp8-amax-history-len", "16", "--fp8-amax-compute-algo", "max",
                                    "--tp-only-amax-red", "--fp8-min-features", "512"}));
  ASSERT_TRUE(c.precision.fp8.enabled());
  const auto& d = std::get<fp8::DelayedScaling>(*c.precision.fp8.recipe);
  EXPECT_EQ(d.amax_history_len, 16);
  EXPECT_EQ(d.amax_compute_algo, fp8::AmaxComputeAlgo::kMax);
  EXPECT_TRUE(c.precision.fp8.tp_only_amax_reduction);
  EXPECT_EQ(c.precision.fp8.min_features, 512);
  EXPECT_TRUE(c.precision.fp8.grouped_gemm_fp8);
  EXPECT_FALSE(build(tiny_args({"--fp8-format", "hybrid", "--no-use-gmm-fp8"})).precision.fp8.grouped_gemm_fp8);
  EXPECT_FALSE(build(tiny_args()).precision.fp8.enabled());
}

}  // namespace
}  // namespace fp8tron
