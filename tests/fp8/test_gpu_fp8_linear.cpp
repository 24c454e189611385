// FP8 linear layers on the GPU (ctest label `gpu`): every recipe x format, forward and backward,
// against the CPU path (the reference quantizers, whose codes the GPU kernels match bit for bit,
// and fp32 GEMMs of the dequantized values). What remains is the GEMM: FP8 tensor-core
// accumulation (or bf16 GEMMs when emulated) and the bf16 output. Prints each error for the record.
#include <gtest/gtest.h>
#include <c10/cuda/CUDAFunctions.h>
#include <torch/torch.h>

#include <cstdio>

#include "core/text.h"
#include "fp8/fp8_grouped_linear.h"
#include "fp8/fp8_linear.h"
#include "fp8/grouped_gemm.h"
#include "fp8/swiglu_backward.h"
#include "models/mlp/fused_swiglu.h"
#include "models/linear/grouped_linear.h"
#include "parallel/parallel_state.h"

namespace fp8tron {
namespace {

#define REQUIRE_GPU() \
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device"

struct Case {
  fp8::RecipeKind kind;
  fp8::Fp8Format format;
};

double relative_error(const torch::Tensor& a, const torch::Tensor& b) {
  auto x = a.to(torch::kCPU, torch::kFloat32), y = b.to(torch::kCPU, torch::kFloat32);
  return ((x - y).norm() / y.norm()).item<double>();
}

TEST(GpuFp8, LinearMatchesCpuEmulationForEveryRecipe) {
  REQUIRE_GPU();
  const Case cases[] = {{fp8::RecipeKind::kDelayed, fp8::Fp8Format::kHybrid},    {fp8::RecipeKind::kDelayed, fp8::Fp8Format::kE4M3},
                        {fp8::RecipeKind::kTensorwise, fp8::Fp8Format::kHybrid}, {fp8::RecipeKind::kTensorwise, fp8::Fp8Format::kE4M3},
                        {fp8::RecipeKind::kTensorwise, fp8::Fp8Format::kHiF8},   {fp8::RecipeKind::kBlockwise, fp8::Fp8Format::kE4M3},
                        {fp8::RecipeKind::kBlockwise, fp8::Fp8Format::kHybrid},  // E5M2 gradients x E4M3 (mixed-type block GEMMs)
                        {fp8::RecipeKind::kMxfp8, fp8::Fp8Format::kE4M3},        {fp8::RecipeKind::kMxfp8, fp8::Fp8Format::kHybrid}};
  const int64_t rows = 1024, in = 512, out = 768;
  for (const Case& c : cases) {
    const fp8::Recipe recipe = fp8::make_recipe(c.kind, c.format);
    SCOPED_TRACE(fp8::describe(recipe));
    fp8::Fp8EngineOptions o;
    o.recipe = recipe;
    o.num_layers = 1;
    fp8::Fp8Engine gpu(o, torch::Device(torch::kCUDA, 0)), cpu(o, torch::Device(torch::kCPU));
    auto gsite = gpu.add_site("decoder.layers.0.mlp.linear_fc1", 0, out, in);
    auto csite = cpu.add_site("decoder.layers.0.mlp.linear_fc1", 0, out, in);
    torch::manual_seed(7);
    // bf16 values on both sides, so both quantize the same numbers.
    auto bf = [](torch::Tensor t) { return t.to(torch::kBFloat16).to(torch::kFloat32); };
    torch::Tensor x0, w0 = bf(torch::randn({out, in}) * 0.03), b0 = bf(torch::randn({out}) * 0.1);
    double worst[4] = {0, 0, 0, 0};
    for (int step = 0; step < 2; ++step) {  // the second step runs on updated delayed scales
      x0 = bf(torch::randn({rows, in}) * (step + 1));
      auto dy0 = bf(torch::randn({rows, out}) * 1e-3);
      auto xg = x0.to(torch::kCUDA, torch::kBFloat16).requires_grad_(true);
      auto wg = w0.to(torch::kCUDA, torch::kBFloat16).requires_grad_(true);
      auto bg = b0.to(torch::kCUDA, torch::kBFloat16).requires_grad_(true);
      auto xc = x0.clone().requires_grad_(true), wc = w0.clone().requires_grad_(true), bc = b0.clone().requires_grad_(true);
      auto yg = fp8::fp8_linear(xg, wg, bg, *gsite);
      auto yc = fp8::fp8_linear(xc, wc, bc, *csite);
      yg.backward(dy0.to(torch::kCUDA, torch::kBFloat16));
      yc.backward(dy0);
      const double e[4] = {relative_error(yg, yc), relative_error(xg.grad(), xc.grad()), relative_error(wg.grad(), wc.grad()),
                           relative_error(bg.grad(), bc.grad())};
      for (int i = 0; i < 4; ++i) worst[i] = std::max(worst[i], e[i]);
      gpu.end_step(nullptr);
      cpu.end_step(nullptr);
      if (c.kind == fp8::RecipeKind::kDelayed) {
        // Same amaxes, same update rule: the same scales on both sides.
        EXPECT_TRUE(torch::equal(gpu.scale().cpu(), cpu.scale())) << "step " << step;
      }
    }
    std::printf("[fp8-module] %-70s %s: y %.2e dX %.2e dW %.2e db %.2e vs CPU emulation\n", fp8::describe(recipe).c_str(),
                gpu.emulated() ? "emulated" : "native  ", worst[0], worst[1], worst[2], worst[3]);
    // bf16 outputs (2^-9) plus FP8 tensor-core accumulation (13-bit partial sums).
    EXPECT_LT(worst[0], 1e-2);
    EXPECT_LT(worst[1], 1e-2);
    EXPECT_LT(worst[2], 1e-2);
    EXPECT_LT(worst[3], 1e-2);
  }
}

// The fused GeLU prologue and bias-gradient column sums give what the unfused path gives.
TEST(GpuFp8, FusedGeluCastAndBiasGradientMatchTheUnfusedPath) {
  REQUIRE_GPU();
  for (auto kind : {fp8::RecipeKind::kDelayed, fp8::RecipeKind::kTensorwise}) {
    fp8::Fp8EngineOptions o;
    o.recipe = fp8::make_recipe(kind, fp8::Fp8Format::kHybrid);
    o.num_layers = 1;
    fp8::Fp8Engine fused_engine(o, torch::Device(torch::kCUDA, 0)), plain_engine(o, torch::Device(torch::kCUDA, 0));
    fused_engine.use_backward_kernels(nullptr, &fused_swiglu_backward);
    plain_engine.use_backward_kernels(nullptr, &fused_swiglu_backward);
    o.deterministic = true;  // no fused bias gradient
    fp8::Fp8Engine det_engine(o, torch::Device(torch::kCUDA, 0));
    auto fs = fused_engine.add_site("decoder.layers.0.mlp.linear_fc2", 0, 512, 2048);
    auto ps = plain_engine.add_site("decoder.layers.0.mlp.linear_fc2", 0, 512, 2048);
    auto ds = det_engine.add_site("decoder.layers.0.mlp.linear_fc2", 0, 512, 2048);
    torch::manual_seed(3);
    auto opts = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kBFloat16);
    auto h0 = torch::randn({1024, 2048}, opts) * 2, w0 = torch::randn({512, 2048}, opts) * 0.02, b0 = torch::randn({512}, opts);
    auto dy = torch::randn({1024, 512}, opts) * 1e-3;
    auto run = [&](fp8::Fp8Site& site, bool fused) {
      auto h = h0.clone().requires_grad_(true), w = w0.clone().requires_grad_(true), b = b0.clone().requires_grad_(true);
      auto y = fused ? fp8::fp8_linear(h, w, b, site, fp8::Prologue::kGeluTanh) : fp8::fp8_linear(at::gelu(h, "tanh"), w, b, site);
      y.backward(dy);
      return std::vector<torch::Tensor>{y.detach(), h.grad(), w.grad(), b.grad()};
    };
    auto f = run(*fs, true), p = run(*ps, false), d = run(*ds, true);
    EXPECT_TRUE(torch::equal(f[0], p[0])) << "y: " << relative_error(f[0], p[0]);
    EXPECT_LT(relative_error(f[1], p[1]), 1e-6);
    EXPECT_TRUE(torch::equal(f[2], p[2]));
    EXPECT_LT(relative_error(f[3], p[3]), 1e-2);  // bf16 bias gradient, atomics in another order
    EXPECT_TRUE(torch::equal(d[3], p[3]));        // deterministic mode: torch's reduction
    std::printf("[fp8-module] fused GeLU cast + bias gradient (%s): y identical %d, dW identical %d, db %.2e\n",
                fp8::recipe_kind_name(kind), int(torch::equal(f[0], p[0])), int(torch::equal(f[2], p[2])),
                relative_error(f[3], p[3]));
  }
}

// fc1 -> GeLU -> fc2 with the GeLU in fc2's input cast and its derivative in fc1's gradient cast,
// against the unfused chain (torch's gelu and gelu_backward between the two linears).
TEST(GpuFp8, MlpWithFusedGeluBothWaysMatchesTheUnfusedChain) {
  REQUIRE_GPU();
  for (auto kind : {fp8::RecipeKind::kDelayed, fp8::RecipeKind::kTensorwise}) {
    fp8::Fp8EngineOptions o;
    o.recipe = fp8::make_recipe(kind, fp8::Fp8Format::kHybrid);
    o.num_layers = 1;
    o.deterministic = true;  // bias gradients by torch's reduction on both sides
    fp8::Fp8Engine engine(o, torch::Device(torch::kCUDA, 0));
    auto fc1 = engine.add_site("decoder.layers.0.mlp.linear_fc1", 0, 2048, 512);
    auto fc2 = engine.add_site("decoder.layers.0.mlp.linear_fc2", 0, 512, 2048);
    auto opts = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kBFloat16);
    torch::manual_seed(13);
    auto x = torch::randn({1024, 512}, opts).requires_grad_(true);
    auto w1 = (torch::randn({2048, 512}, opts) * 0.05).requires_grad_(true), b1 = torch::randn({2048}, opts).requires_grad_(true);
    auto w2 = (torch::randn({512, 2048}, opts) * 0.02).requires_grad_(true), b2 = torch::randn({512}, opts).requires_grad_(true);
    auto dy = torch::randn({1024, 512}, opts) * 1e-2;
    auto run = [&](bool fused) {
      for (auto* t : {&x, &w1, &b1, &w2, &b2}) t->mutable_grad() = torch::Tensor();
      auto h = fp8::fp8_linear(x, w1, b1, *fc1);
      auto y = fused ? fp8::fp8_linear(h, w2, b2, *fc2, fp8::Prologue::kGeluTanh) : fp8::fp8_linear(at::gelu(h, "tanh"), w2, b2, *fc2);
      y.backward(dy);
      return std::vector<torch::Tensor>{y.detach(), x.grad(), w1.grad(), b1.grad(), w2.grad(), b2.grad()};
    };
    auto f = run(true), p = run(false);
    double worst = 0;
    for (size_t i = 0; i < f.size(); ++i) worst = std::max(worst, relative_error(f[i], p[i]));
    std::printf("[fp8-module] MLP with GeLU fused into both casts (%s): largest difference %.2e from the unfused chain\n",
                fp8::recipe_kind_name(kind), worst);
    EXPECT_TRUE(torch::equal(f[0], p[0]));
    EXPECT_LT(worst, 1e-2);  // a few bf16 roundings of dGeLU may differ (fp32 op order)
  }
}

// LayerNorm fused into the cast of the GEMM input (delayed scaling) against layer_norm + fp8_linear:
// the statistics and the normalization round like torch's up to an occasional bf16 ulp.
TEST(GpuFp8, NormFusedIntoTheCastMatchesTheUnfusedPath) {
  REQUIRE_GPU();
  for (bool rms : {false, true}) {
    fp8::Fp8EngineOptions o;
    o.recipe = fp8::make_recipe(fp8::RecipeKind::kDelayed, fp8::Fp8Format::kHybrid);
    o.num_layers = 1;
    fp8::Fp8Engine fused_engine(o, torch::Device(torch::kCUDA, 0)), plain_engine(o, torch::Device(torch::kCUDA, 0));
    fused_engine.use_backward_kernels(nullptr, &fused_swiglu_backward);
    plain_engine.use_backward_kernels(nullptr, &fused_swiglu_backward);
    auto fs = fused_engine.add_site("decoder.layers.0.self_attention.linear_qkv", 0, 1536, 512);
    auto ps = plain_engine.add_site("decoder.layers.0.self_attention.linear_qkv", 0, 1536, 512);
    auto opts = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kBFloat16);
    torch::manual_seed(17);
    auto x0 = torch::randn({1024, 512}, opts) * 3 + 1, g0 = torch::randn({512}, opts) * 0.1 + 1, be0 = torch::randn({512}, opts) * 0.1;
    auto w0 = torch::randn({1536, 512}, opts) * 0.02, b0 = torch::randn({1536}, opts) * 0.1;
    auto dy = torch::randn({1024, 1536}, opts) * 1e-2;
    auto run = [&](bool fused) {
      auto x = x0.clone().requires_grad_(true), g = g0.clone().requires_grad_(true), be = be0.clone().requires_grad_(!rms);
      auto w = w0.clone().requires_grad_(true), b = b0.clone().requires_grad_(true);
      torch::Tensor y;
      for (int step = 0; step < 2; ++step) {  // the second step quantizes with the recorded amaxes
        for (auto* t : {&x, &g, &be, &w, &b}) t->mutable_grad() = torch::Tensor();
        const auto normed = rms ? at::rms_norm(x, {512}, g, 1e-5) : at::layer_norm(x, {512}, g, be, 1e-5);
        y = fused ? fp8::fp8_norm_linear(x, rms, g, rms ? torch::Tensor() : be, 1e-5, false, w, b, *fs)
                  : fp8::fp8_linear(normed, w, b, *ps);
        y.backward(dy);
        (fused ? fused_engine : plain_engine).end_step(nullptr);
      }
      std::vector<torch::Tensor> out{y.detach(), x.grad(), g.grad(), w.grad(), b.grad()};
      if (!rms) out.push_back(be.grad());
      return out;
    };
    auto f = run(true), p = run(false);
    const char* names[] = {"y", "dX", "dgamma", "dW", "db", "dbeta"};
    std::string line;
    for (size_t i = 0; i < f.size(); ++i) {
      const double err = relative_error(f[i], p[i]);
      line += std::string(" ") + names[i] + " " + std::to_string(err);
      EXPECT_LT(err, 1e-2) << names[i] << (rms ? " (RMSNorm)" : " (LayerNorm)");
    }
    EXPECT_TRUE(torch::equal(fused_engine.scale().cpu(), plain_engine.scale().cpu()));
    std::printf("[fp8-module] %s fused into the cast vs norm + fp8_linear:%s\n", rms ? "RMSNorm" : "LayerNorm", line.c_str());
  }
}

// SwiGLU fused into the cast of fc2's input against silu(gate) * up then fp8_linear.
TEST(GpuFp8, SwigluFusedIntoTheCastMatchesTheUnfusedPath) {
  REQUIRE_GPU();
  fp8::Fp8EngineOptions o;
  o.recipe = fp8::make_recipe(fp8::RecipeKind::kDelayed, fp8::Fp8Format::kHybrid);
  o.num_layers = 1;
  fp8::Fp8Engine fused_engine(o, torch::Device(torch::kCUDA, 0)), plain_engine(o, torch::Device(torch::kCUDA, 0));
  auto fs = fused_engine.add_site("decoder.layers.0.mlp.linear_fc2", 0, 512, 1024);
  auto ps = plain_engine.add_site("decoder.layers.0.mlp.linear_fc2", 0, 512, 1024);
  auto opts = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kBFloat16);
  torch::manual_seed(19);
  auto h0 = torch::randn({1024, 2048}, opts) * 2, w0 = torch::randn({512, 1024}, opts) * 0.02;
  auto dy = torch::randn({1024, 512}, opts) * 1e-2;
  auto run = [&](bool fused) {
    auto h = h0.clone().requires_grad_(true), w = w0.clone().requires_grad_(true);
    torch::Tensor y;
    if (fused) {
      y = fp8::fp8_linear(h, w, {}, *fs, fp8::Prologue::kSwiglu);
    } else {
      auto halves = h.chunk(2, -1);
      y = fp8::fp8_linear(at::silu(halves[0]) * halves[1], w, {}, *ps);
    }
    y.backward(dy);
    return std::vector<torch::Tensor>{y.detach(), h.grad(), w.grad()};
  };
  auto f = run(true), p = run(false);
  const double ey = relative_error(f[0], p[0]), eh = relative_error(f[1], p[1]), ew = relative_error(f[2], p[2]);
  std::printf("[fp8-module] SwiGLU fused into the cast vs silu * up + fp8_linear: y %.2e dH %.2e dW %.2e\n", ey, eh, ew);
  EXPECT_LT(ey, 1e-2);
  EXPECT_LT(eh, 1e-2);
  EXPECT_LT(ew, 1e-2);
}

// fc1 -> SwiGLU -> fc2 with SwiGLU's backward in fc1's gradient cast (Prologue::kSwigluBackward)
// against fc2 applying the exact backward kernel and fc1 casting its bf16 output. The cast's fast
// exponential and reciprocal move a few bf16 roundings: fc1's gradients agree to FP8 precision,
// fc2's (upstream of the hand-over) bit for bit. Two steps, so the second casts with the scales
// the first recorded.
TEST(GpuFp8, SwigluBackwardInFc1sGradientCastMatchesTheKernelPlusCast) {
  REQUIRE_GPU();
  fp8::Fp8EngineOptions o;
  o.recipe = fp8::make_recipe(fp8::RecipeKind::kDelayed, fp8::Fp8Format::kHybrid);
  o.num_layers = 1;
  for (bool with_bias : {false, true}) {
    fp8::Fp8Engine fused_engine(o, torch::Device(torch::kCUDA, 0)), plain_engine(o, torch::Device(torch::kCUDA, 0));
    fused_engine.use_backward_kernels(nullptr, &fused_swiglu_backward);
    plain_engine.use_backward_kernels(nullptr, &fused_swiglu_backward);
    auto sites = [](fp8::Fp8Engine& e) {
      return std::pair{e.add_site("decoder.layers.0.mlp.linear_fc1", 0, 2048, 512),
                       e.add_site("decoder.layers.0.mlp.linear_fc2", 0, 512, 1024)};
    };
    auto fused_sites = sites(fused_engine), plain_sites = sites(plain_engine);
    auto opts = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kBFloat16);
    torch::manual_seed(23);
    auto x0 = torch::randn({1024, 512}, opts), w10 = torch::randn({2048, 512}, opts) * 0.05;
    auto b10 = torch::randn({2048}, opts) * 0.1, w20 = torch::randn({512, 1024}, opts) * 0.02;
    auto dy = torch::randn({1024, 512}, opts) * 1e-2;
    auto run = [&](bool fused) {
      auto& [fc1, fc2] = fused ? fused_sites : plain_sites;
      fp8::Fp8Engine& engine = fused ? fused_engine : plain_engine;
      auto x = x0.clone().requires_grad_(true), w1 = w10.clone().requires_grad_(true);
      auto b1 = with_bias ? b10.clone().requires_grad_(true) : torch::Tensor(), w2 = w20.clone().requires_grad_(true);
      std::vector<torch::Tensor> out;
      for (int step = 0; step < 2; ++step) {
        for (auto* t : {&x, &w1, &b1, &w2})
          if (t->defined()) t->mutable_grad() = torch::Tensor();
        auto h = fp8::fp8_linear(x, w1, b1, *fc1);
        if (!fused) h = h.view(h.sizes());  // a view stops the hand-over: fc2 applies the backward
        auto y = fp8::fp8_linear(h, w2, {}, *fc2, fp8::Prologue::kSwiglu);
        EXPECT_EQ(fp8::hands_over_swiglu_backward(h), fused);
        y.backward(dy);
        engine.end_step(nullptr);
        out = {y.detach(), x.grad(), w1.grad(), w2.grad(), with_bias ? b1.grad() : torch::zeros({1}, opts)};
      }
      return out;
    };
    auto f = run(true), p = run(false);
    SCOPED_TRACE(with_bias ? "with bias" : "without bias");
    EXPECT_TRUE(torch::equal(f[0], p[0])) << "y";
    EXPECT_TRUE(torch::equal(f[3], p[3])) << "dW2";
    const double edx = relative_error(f[1], p[1]), edw1 = relative_error(f[2], p[2]);
    const double edb = with_bias ? relative_error(f[4], p[4]) : 0.0;
    // The scales the two steps' recorded amaxes gave (the history itself is cleared for the next step).
    const double eamax = relative_error(fused_engine.scale(), plain_engine.scale());
    EXPECT_LT(edx, 1e-2);
    EXPECT_LT(edw1, 1e-2);
    EXPECT_LT(edb, 1e-2);
    EXPECT_LT(eamax, 1e-2);
    EXPECT_GT(f[1].abs().sum().item<float>(), 0.0f);
    std::printf("[fp8-module] SwiGLU backward in fc1's gradient cast%s vs the kernel + cast: y, dW2 bitwise; dx %.1e "
                "dW1 %.1e db1 %.1e scales %.1e\n",
                with_bias ? " (with bias)" : "", edx, edw1, edb, eamax);
  }
}

// With an fp32 main gradient on the weight, the wgrad GEMM accumulates into it (autograd gets no
// weight gradient): the sum over micro-batches matches the unfused bf16 wgrads added in fp32.
TEST(GpuFp8, WgradAccumulatesIntoTheMainGradient) {
  REQUIRE_GPU();
  fp8::Fp8EngineOptions o;
  o.recipe = fp8::make_recipe(fp8::RecipeKind::kDelayed, fp8::Fp8Format::kHybrid);
  o.num_layers = 1;
  fp8::Fp8Engine engine(o, torch::Device(torch::kCUDA, 0));
  auto site = engine.add_site("decoder.layers.0.mlp.linear_fc1", 0, 1024, 512);
  auto opts = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kBFloat16);
  torch::manual_seed(5);
  auto w = (torch::randn({1024, 512}, opts) * 0.02).requires_grad_(true);
  auto reference = torch::zeros({1024, 512}, opts.dtype(torch::kFloat32));
  auto main_grad = torch::zeros({1024, 512}, opts.dtype(torch::kFloat32));
  for (int micro = 0; micro < 3; ++micro) {
    auto x = torch::randn({2048, 512}, opts).requires_grad_(true);
    auto dy = torch::randn({2048, 1024}, opts) * 1e-2;
    w.mutable_grad() = torch::Tensor();  // unfused: autograd's bf16 dW
    fp8::fp8_linear(x, w, {}, *site).backward(dy);
    reference += w.grad().to(torch::kFloat32);
    w.mutable_grad() = main_grad;  // fused: into the fp32 buffer
    fp8::fp8_linear(x, w, {}, *site).backward(dy);
    EXPECT_EQ(w.grad().data_ptr(), main_grad.data_ptr());
  }
  const double err = relative_error(main_grad, reference);
  std::printf("[fp8-module] wgrad accumulated into the fp32 main gradient: %.2e from the unfused bf16 sum\n", err);
  EXPECT_LT(err, 5e-3);  // the unfused path rounds each micro-batch's dW to bf16
  EXPECT_GT(main_grad.abs().sum().item<float>(), 0.0f);

  // With the optimizer not zeroing it: the next step's first micro-batch overwrites the stale sum.
  engine.set_overwrite_main_grads(true);
  ASSERT_TRUE(engine.overwrite_main_grads());
  engine.end_step(nullptr);
  main_grad.fill_(1e6);
  reference.zero_();
  for (int micro = 0; micro < 2; ++micro) {
    auto x = torch::randn({2048, 512}, opts).requires_grad_(true);
    auto dy = torch::randn({2048, 1024}, opts) * 1e-2;
    engine.set_overwrite_main_grads(false);
    w.mutable_grad() = torch::Tensor();
    fp8::fp8_linear(x, w, {}, *site).backward(dy);
    reference += w.grad().to(torch::kFloat32);
    engine.set_overwrite_main_grads(true);
    w.mutable_grad() = main_grad;
    fp8::fp8_linear(x, w, {}, *site).backward(dy);
  }
  EXPECT_LT(relative_error(main_grad, reference), 5e-3);
}

// --no-fp8-wgrad on the native path: the wgrad is the bf16 product of the unquantized dY and f(x)
// with fp32 accumulation, into the fp32 main gradient (written by a step's first backward, added by
// the next) or returned to autograd; the output and dX stay those of the FP8-wgrad linear. For the
// prologues the backward fuses with FP8 wgrads (GeLU, SwiGLU), here unfused.
TEST(GpuFp8, NoFp8WgradIsTheBf16ProductOnTheNativePath) {
  REQUIRE_GPU();
  auto opts = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kBFloat16);
  for (auto prologue : {fp8::Prologue::kNone, fp8::Prologue::kGeluTanh, fp8::Prologue::kSwiglu}) {
    SCOPED_TRACE(int(prologue));
    auto make = [](bool fp8_wgrad) {
      fp8::Fp8EngineOptions o;
      o.recipe = fp8::make_recipe(fp8::RecipeKind::kDelayed, fp8::Fp8Format::kHybrid);
      o.num_layers = 1;
      o.fp8_wgrad = fp8_wgrad;
      return std::make_shared<fp8::Fp8Engine>(o, torch::Device(torch::kCUDA, 0));
    };
    auto fp8_engine = make(true), bf16_engine = make(false);
    const int64_t in = 512, out = 1024, rows = 2048, width = prologue == fp8::Prologue::kSwiglu ? 2 * in : in;
    auto fp8_site = fp8_engine->add_site("decoder.layers.0.mlp.linear_fc2", 0, out, in);
    auto bf16_site = bf16_engine->add_site("decoder.layers.0.mlp.linear_fc2", 0, out, in);
    torch::manual_seed(7);
    auto w = (torch::randn({out, in}, opts) * 0.02).requires_grad_(true);
    auto b = (torch::randn({out}, opts) * 0.1).requires_grad_(true);
    auto x = torch::randn({rows, width}, opts).requires_grad_(true);
    auto dy = torch::randn({rows, out}, opts) * 1e-2;
    auto y_fp8 = fp8::fp8_linear(x, w, b, *fp8_site, prologue);
    y_fp8.backward(dy);
    const auto dx_fp8 = x.grad().clone(), db_fp8 = b.grad().clone();
    x.mutable_grad() = torch::Tensor();
    b.mutable_grad() = torch::Tensor();
    w.mutable_grad() = torch::Tensor();
    auto y = fp8::fp8_linear(x, w, b, *bf16_site, prologue);
    y.backward(dy);
    EXPECT_TRUE(torch::equal(y, y_fp8));
    EXPECT_TRUE(torch::equal(x.grad(), dx_fp8));
    EXPECT_LT(relative_error(b.grad(), db_fp8), 1e-2);
    torch::Tensor f = x.detach();
    if (prologue == fp8::Prologue::kGeluTanh) f = at::gelu(f, "tanh");
    if (prologue == fp8::Prologue::kSwiglu) f = at::silu(f.narrow(1, 0, in)) * f.narrow(1, in, in);
    const auto exact = torch::mm(dy.t().to(torch::kFloat32), f.to(torch::kFloat32));
    const double err = relative_error(w.grad(), exact);
    std::printf("[fp8-module] --no-fp8-wgrad (prologue %d): bf16 wgrad %.2e from the fp32 product\n", int(prologue), err);
    EXPECT_LT(err, 5e-3);  // dW rounded to bf16 for autograd
    // Into the fp32 main gradient: overwritten by the step's first backward, then accumulated.
    auto main_grad = torch::full({out, in}, 1e6, opts.dtype(torch::kFloat32));
    bf16_engine->set_overwrite_main_grads(true);
    bf16_engine->end_step(nullptr);
    w.mutable_grad() = main_grad;
    for (int micro = 0; micro < 2; ++micro) fp8::fp8_linear(x, w, b, *bf16_site, prologue).backward(dy);
    EXPECT_EQ(w.grad().data_ptr(), main_grad.data_ptr());
    const double err2 = relative_error(main_grad, 2 * exact);
    EXPECT_LT(err2, 1e-4) << "fp32 accumulation of the bf16 products";
  }
}

// TEGroupedLinear on the GPU: FP8 experts against per-expert fp8_linear, one expert idle; with the
// optimizer leaving the main gradients to the GEMMs, the idle expert's stale gradient is cleared.
TEST(GpuFp8, GroupedLinearExpertsMatchPerExpertLinearsAndClearIdleGradients) {
  REQUIRE_GPU();
  fp8::Fp8EngineOptions o;
  o.recipe = fp8::make_recipe(fp8::RecipeKind::kDelayed, fp8::Fp8Format::kHybrid);
  o.num_layers = 4;
  auto engine = std::make_shared<fp8::Fp8Engine>(o, torch::Device(torch::kCUDA, 0));
  fp8::Fp8Engine reference_engine(o, torch::Device(torch::kCUDA, 0));
  TensorParallelContext tp{make_self_communicator("tp", 0), 0, 1, false};
  GroupedLinearOptions g;
  g.in_features = 512;
  g.out_features = 768;
  g.num_gemms = 3;
  g.init_name = "decoder.layers.1.mlp.experts.linear_fc1";
  TEGroupedLinear grouped(g, ModuleFactory(7, tp, engine));
  grouped->to(torch::Device(torch::kCUDA, 0), torch::kBFloat16);
  ASSERT_EQ(grouped->fp8_sites.size(), 3u);
  std::vector<std::shared_ptr<fp8::Fp8Site>> sites;
  for (int i = 0; i < 3; ++i) sites.push_back(reference_engine.add_site("expert" + std::to_string(i), 1, 768, 512));
  // The optimizer's arrangement: fp32 main gradients the wgrad GEMMs overwrite each step.
  std::vector<torch::Tensor> main_grads;
  for (auto& w : grouped->weights) {
    main_grads.push_back(torch::full(w.sizes(), 1e3, w.options().dtype(torch::kFloat32)));  // stale
    w.mutable_grad() = main_grads.back();
  }
  engine->set_overwrite_main_grads(true);
  engine->end_step(nullptr);
  const std::vector<int64_t> splits = {500, 0, 268};  // not multiples of 16: padded inside
  auto opts = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kBFloat16);
  torch::manual_seed(23);
  auto x = torch::randn({768, 512}, opts);
  auto dy = torch::randn({768, 768}, opts) * 1e-2;
  auto y = grouped->forward(x, splits);
  y.backward(dy);
  int64_t row = 0;
  double worst = 0;
  for (int i = 0; i < 3; ++i) {
    if (splits[i] == 0) {
      EXPECT_EQ(main_grads[i].abs().max().item<float>(), 0.0f) << "idle expert " << i << " kept a stale gradient";
      continue;
    }
    auto w = grouped->weights[i].detach().clone().requires_grad_(true);
    const int64_t padded = (splits[i] + 15) / 16 * 16;
    auto pad = [&](const torch::Tensor& t) { return torch::cat({t, torch::zeros({padded - t.size(0), t.size(1)}, t.options())}); };
    auto yi = fp8::fp8_linear(pad(x.narrow(0, row, splits[i])), w, grouped->biases[i].detach(), *sites[i]).narrow(0, 0, splits[i]);
    yi.backward(dy.narrow(0, row, splits[i]));
    worst = std::max({worst, relative_error(y.narrow(0, row, splits[i]), yi), relative_error(main_grads[i], w.grad())});
    row += splits[i];
  }
  std::printf("[fp8-module] TEGroupedLinear (3 FP8 experts, one idle) vs per-expert fp8_linear: %.2e\n", worst);
  EXPECT_LT(worst, 5e-3);
}

// The fused SwiGLU casts change which bf16 values reach the FP8 casts by a rounding (the fast
// exponential): each such change can move an E5M2 code a whole step, and once a recorded amax
// differs, the next step's scales differ and every code may. So a fused path is not compared with
// the unfused one to a fixed tolerance, but both with the same chain without FP8 (bf16 GEMMs, the
// same weights): the fused path must be as accurate as the unfused one. A wrong offset, scale or
// gradient would be off by far more.
void expect_as_accurate(const std::vector<torch::Tensor>& fused, const std::vector<torch::Tensor>& unfused,
                        const std::vector<torch::Tensor>& exact, const char* what) {
  ASSERT_EQ(fused.size(), exact.size());
  ASSERT_EQ(unfused.size(), exact.size());
  std::string line;
  for (size_t i = 0; i < exact.size(); ++i) {
    const double ef = relative_error(fused[i], exact[i]), eu = relative_error(unfused[i], exact[i]);
    EXPECT_LT(ef, 1.25 * eu + 2e-3) << what << ": output " << i << " (unfused " << eu << ")";
    EXPECT_LT(ef, 0.1) << what << ": output " << i;
    line += strprintf(" %.1e/%.1e", ef, eu);
  }
  std::printf("[fp8-module] %s, error vs bf16 fused/unfused:%s\n", what, line.c_str());
}

// An MoE fc2 with the SwiGLU inside its grouped input cast (TEGroupedLinear::forward_swiglu)
// against silu(gate) * up in torch's ops followed by the plain grouped linear, both against bf16
// GEMMs, two steps (the second casts with the scales the first recorded), unaligned counts and an
// idle expert.
TEST(GpuFp8, GroupedSwigluFusedIntoTheCastMatchesTheUnfusedPath) {
  REQUIRE_GPU();
  fp8::Fp8EngineOptions o;
  o.recipe = fp8::make_recipe(fp8::RecipeKind::kDelayed, fp8::Fp8Format::kHybrid);
  o.num_layers = 4;
  TensorParallelContext tp{make_self_communicator("tp", 0), 0, 1, false};
  GroupedLinearOptions g;
  g.in_features = 512;
  g.out_features = 768;
  g.num_gemms = 3;
  g.init_name = "decoder.layers.1.mlp.experts.linear_fc2";
  auto module = [&](const std::shared_ptr<fp8::Fp8Engine>& engine) {
    TEGroupedLinear m(g, ModuleFactory(7, tp, engine));
    m->to(torch::Device(torch::kCUDA, 0), torch::kBFloat16);
    return m;
  };
  auto fused_engine = std::make_shared<fp8::Fp8Engine>(o, torch::Device(torch::kCUDA, 0));
  auto plain_engine = std::make_shared<fp8::Fp8Engine>(o, torch::Device(torch::kCUDA, 0));
  TEGroupedLinear fused = module(fused_engine), plain = module(plain_engine), exact = module(nullptr);
  ASSERT_TRUE(fused->fuses_swiglu());
  ASSERT_FALSE(exact->fuses_swiglu());
  const std::vector<int64_t> splits = {500, 0, 268};
  auto opts = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kBFloat16);
  for (int step = 0; step < 2; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    torch::manual_seed(31 + step);
    const auto h0 = torch::randn({768, 1024}, opts) * 2, dy = torch::randn({768, 768}, opts) * 1e-2;
    auto run = [&](TEGroupedLinear& m, bool fuse) {
      for (auto& p : m->parameters()) p.mutable_grad() = torch::Tensor();
      auto h = h0.clone().requires_grad_(true);
      auto y = fuse ? m->forward_swiglu(h, splits) : m->forward(fp8::torch_swiglu(h), splits);
      y.backward(dy);
      std::vector<torch::Tensor> out{y.detach(), h.grad()};
      for (size_t i : {0, 2}) out.push_back(m->weights[i].grad());
      return out;
    };
    const auto f = run(fused, true), p = run(plain, false), r = run(exact, false);
    expect_as_accurate(f, p, r, "grouped SwiGLU fused into fc2's cast (y, dH, dW0, dW2)");
    EXPECT_EQ(fused->weights[1].grad().abs().max().item<float>(), 0.0f) << "idle expert";
    fused_engine->end_step(nullptr);
    plain_engine->end_step(nullptr);
  }
}

// An MoE's fc1 -> SwiGLU -> fc2 with the hand-over: fc2's cast computes the SwiGLU, fc1's gradient
// cast its backward (Prologue::kSwigluBackward), with and without biases (their gradients from
// that cast's column sums). Against fc1 -> torch's SwiGLU -> fc2, both against bf16 GEMMs, two steps.
TEST(GpuFp8, GroupedSwigluBackwardInFc1sGradientCastMatchesTheUnfusedChain) {
  REQUIRE_GPU();
  fp8::Fp8EngineOptions o;
  o.recipe = fp8::make_recipe(fp8::RecipeKind::kDelayed, fp8::Fp8Format::kHybrid);
  o.num_layers = 4;
  TensorParallelContext tp{make_self_communicator("tp", 0), 0, 1, false};
  for (bool bias : {false, true}) {
    SCOPED_TRACE(bias ? "with biases" : "without biases");
    struct Mlp {
      std::shared_ptr<fp8::Fp8Engine> engine;
      TEGroupedLinear fc1{nullptr}, fc2{nullptr};
    };
    auto make = [&](bool fp8_run) {
      torch::manual_seed(3);
      Mlp m{fp8_run ? std::make_shared<fp8::Fp8Engine>(o, torch::Device(torch::kCUDA, 0)) : nullptr};
      GroupedLinearOptions g;
      g.in_features = 512;
      g.out_features = 2 * 256;
      g.num_gemms = 3;
      g.bias = bias;
      g.init_name = "decoder.layers.1.mlp.experts.linear_fc1";
      m.fc1 = TEGroupedLinear(g, ModuleFactory(7, tp, m.engine));
      g.in_features = 256;
      g.out_features = 512;
      g.parallel_mode = GroupedParallelMode::kRow;
      g.init_name = "decoder.layers.1.mlp.experts.linear_fc2";
      m.fc2 = TEGroupedLinear(g, ModuleFactory(8, tp, m.engine));
      for (auto* mod : {&m.fc1, &m.fc2}) {
        (*mod)->to(torch::Device(torch::kCUDA, 0), torch::kBFloat16);
        torch::NoGradGuard no_grad;
        for (auto& b : (*mod)->biases) b.copy_(torch::randn(b.sizes(), b.options()) * 0.1);
      }
      return m;
    };
    Mlp fused = make(true), plain = make(true), exact = make(false);
    ASSERT_TRUE(fused.fc2->fuses_swiglu());
    const std::vector<int64_t> splits = {500, 0, 268};
    auto opts = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kBFloat16);
    for (int step = 0; step < 2; ++step) {
      SCOPED_TRACE("step " + std::to_string(step));
      torch::manual_seed(41 + step);
      const auto x0 = torch::randn({768, 512}, opts), dy = torch::randn({768, 512}, opts) * 1e-2;
      auto run = [&](Mlp& m, bool fuse) {
        for (auto* mod : {&m.fc1, &m.fc2})
          for (auto& p : (*mod)->parameters()) p.mutable_grad() = torch::Tensor();
        auto x = x0.clone().requires_grad_(true);
        auto h = m.fc1(x, splits);
        auto y = fuse ? m.fc2->forward_swiglu(h, splits) : m.fc2(fp8::torch_swiglu(h), splits);
        EXPECT_EQ(fp8::grouped_hands_over_swiglu_backward(h), fuse);
        y.backward(dy);
        std::vector<torch::Tensor> out{y.detach(), x.grad()};
        for (auto* mod : {&m.fc1, &m.fc2})
          for (size_t i : {0, 2}) {
            out.push_back((*mod)->weights[i].grad());
            if (bias) out.push_back((*mod)->biases[i].grad());
          }
        return out;
      };
      const auto f = run(fused, true), p = run(plain, false), r = run(exact, false);
      expect_as_accurate(f, p, r, bias ? "grouped fc1 -> SwiGLU -> fc2 with the hand-over, biases"
                                       : "grouped fc1 -> SwiGLU -> fc2 with the hand-over");
      EXPECT_GT(f[1].abs().sum().item<float>(), 0.0f);
      EXPECT_EQ(fused.fc1->weights[1].grad().abs().max().item<float>(), 0.0f) << "idle expert";
      fused.engine->end_step(nullptr);
      plain.engine->end_step(nullptr);
    }
  }
}

// The grouped FP8 linear, every recipe, token counts that are not multiples of the alignment and
// an idle expert, two steps: against one fp8_linear per expert on its zero-padded rows (GPU: the
// same codes, other GEMM algorithms) and against the grouped CPU emulation (the reference
// quantizers and fp32 GEMMs); delayed scales equal on all three (same amaxes, same update).
TEST(GpuFp8, GroupedLinearEveryRecipeMatchesPaddedPerExpertLinearsAndCpuEmulation) {
  REQUIRE_GPU();
  const Case cases[] = {{fp8::RecipeKind::kDelayed, fp8::Fp8Format::kHybrid},    {fp8::RecipeKind::kDelayed, fp8::Fp8Format::kE4M3},
                        {fp8::RecipeKind::kTensorwise, fp8::Fp8Format::kHybrid}, {fp8::RecipeKind::kTensorwise, fp8::Fp8Format::kHiF8},
                        {fp8::RecipeKind::kBlockwise, fp8::Fp8Format::kE4M3},    {fp8::RecipeKind::kMxfp8, fp8::Fp8Format::kE4M3},
                        {fp8::RecipeKind::kMxfp8, fp8::Fp8Format::kHybrid}};
  const int64_t in = 512, out = 768;
  const std::vector<int64_t> splits = {300, 0, 517, 1000, 64};
  const size_t experts = splits.size();
  int64_t rows = 0;
  for (auto m : splits) rows += m;
  for (const Case& c : cases) {
    const fp8::Recipe recipe = fp8::make_recipe(c.kind, c.format);
    SCOPED_TRACE(fp8::describe(recipe));
    fp8::Fp8EngineOptions o;
    o.recipe = recipe;
    o.num_layers = 1;
    const torch::Device cuda(torch::kCUDA, 0), cpu_device(torch::kCPU);
    fp8::Fp8Engine gpu(o, cuda), reference(o, cuda), cpu(o, cpu_device);
    std::vector<fp8::Fp8Site*> gsites, csites;
    std::vector<std::shared_ptr<fp8::Fp8Site>> owned, rsites;
    for (size_t i = 0; i < experts; ++i) {
      const std::string name = "decoder.layers.0.mlp.experts.linear_fc1.weight" + std::to_string(i);
      owned.push_back(gpu.add_site(name, 0, out, in));
      gsites.push_back(owned.back().get());
      owned.push_back(cpu.add_site(name, 0, out, in));
      csites.push_back(owned.back().get());
      rsites.push_back(reference.add_site(name, 0, out, in));
    }
    const int64_t align = int64_t(fp8::fp8_token_alignment(recipe));
    auto bf = [](torch::Tensor t) { return t.to(torch::kBFloat16).to(torch::kFloat32); };
    torch::manual_seed(31);
    std::vector<torch::Tensor> w0, b0;
    for (size_t i = 0; i < experts; ++i) {
      w0.push_back(bf(torch::randn({out, in}) * 0.03));
      b0.push_back(bf(torch::randn({out}) * 0.1));
    }
    double worst_ref[4] = {0, 0, 0, 0}, worst_cpu[4] = {0, 0, 0, 0};
    for (int step = 0; step < 2; ++step) {
      auto x0 = bf(torch::randn({rows, in}) * (step + 1));
      auto dy0 = bf(torch::randn({rows, out}) * 1e-3);
      // Returns y, dx, then dW and db of every expert.
      auto run_grouped = [&](const torch::Device& d, const std::vector<fp8::Fp8Site*>& sites) {
        const auto dtype = d.is_cuda() ? torch::kBFloat16 : torch::kFloat32;
        auto x = x0.to(d, dtype).detach().requires_grad_(true);
        std::vector<torch::Tensor> w, b;
        for (size_t i = 0; i < experts; ++i) {
          w.push_back(w0[i].to(d, dtype).detach().requires_grad_(true));
          b.push_back(b0[i].to(d, dtype).detach().requires_grad_(true));
        }
        auto y = fp8::grouped_linear(x, splits, w, b, sites);
        y.backward(dy0.to(d, dtype));
        std::vector<torch::Tensor> r{y.detach(), x.grad()};
        for (size_t i = 0; i < experts; ++i) {
          r.push_back(w[i].grad());
          r.push_back(b[i].grad());
        }
        return r;
      };
      auto run_reference = [&] {
        auto x = x0.to(cuda, torch::kBFloat16).requires_grad_(true);
        std::vector<torch::Tensor> w, b, ys;
        int64_t row = 0;
        for (size_t i = 0; i < experts; ++i) {
          w.push_back(w0[i].to(cuda, torch::kBFloat16).requires_grad_(true));
          b.push_back(b0[i].to(cuda, torch::kBFloat16).requires_grad_(true));
          if (splits[i] > 0) {
            const int64_t padded = (splits[i] + align - 1) / align * align;
            auto xi = x.narrow(0, row, splits[i]);
            xi = torch::cat({xi, torch::zeros({padded - splits[i], in}, xi.options())});
            ys.push_back(fp8::fp8_linear(xi, w[i], b[i], *rsites[i]).narrow(0, 0, splits[i]));
          }
          row += splits[i];
        }
        auto y = torch::cat(ys);
        y.backward(dy0.to(cuda, torch::kBFloat16));
        std::vector<torch::Tensor> r{y.detach(), x.grad()};
        for (size_t i = 0; i < experts; ++i) {
          r.push_back(w[i].grad().defined() ? w[i].grad() : torch::zeros_like(w[i]));
          r.push_back(b[i].grad().defined() ? b[i].grad() : torch::zeros_like(b[i]));
        }
        return r;
      };
      const auto g = run_grouped(cuda, gsites), cp = run_grouped(cpu_device, csites), ref = run_reference();
      for (size_t k = 0; k < g.size(); ++k) {
        const size_t what = k < 2 ? k : 2 + (k - 2) % 2;  // y, dx, dW, db
        const size_t expert = k < 2 ? 0 : (k - 2) / 2;
        if (k >= 2 && splits[expert] == 0) {
          ASSERT_TRUE(g[k].defined());
          EXPECT_EQ(g[k].abs().max().item<float>(), 0.0f) << "idle expert " << expert;
          continue;
        }
        worst_ref[what] = std::max(worst_ref[what], relative_error(g[k], ref[k]));
        worst_cpu[what] = std::max(worst_cpu[what], relative_error(g[k], cp[k]));
      }
      gpu.end_step(nullptr);
      reference.end_step(nullptr);
      cpu.end_step(nullptr);
      if (c.kind == fp8::RecipeKind::kDelayed) {
        EXPECT_TRUE(torch::equal(gpu.scale().cpu(), cpu.scale())) << "step " << step;
        EXPECT_TRUE(torch::equal(gpu.scale(), reference.scale())) << "step " << step;
      }
    }
    std::printf("[fp8-module] grouped %-62s %s: vs padded per-expert y %.2e dX %.2e dW %.2e db %.2e; vs CPU y %.2e dX "
                "%.2e dW %.2e db %.2e\n",
                fp8::describe(recipe).c_str(), gpu.emulated() ? "emulated" : "native  ", worst_ref[0], worst_ref[1],
                worst_ref[2], worst_ref[3], worst_cpu[0], worst_cpu[1], worst_cpu[2], worst_cpu[3]);
    for (int i = 0; i < 4; ++i) {
      EXPECT_LT(worst_ref[i], 5e-3) << "quantity " << i;  // same codes; GEMM algorithms and bf16 rounding differ
      EXPECT_LT(worst_cpu[i], 1e-2) << "quantity " << i;  // as the dense layer against its CPU emulation
    }
  }
}

// The bf16 grouped linear on the GPU, each backend and the timed choice, with fp32 main gradients
// (the wgrad adds into them) and an idle expert, against per-expert F::linear.
TEST(GpuFp8, GroupedLinearBf16MatchesPerExpertLinears) {
  REQUIRE_GPU();
  const int64_t in = 1024, out = 512;
  const std::vector<int64_t> splits = {777, 0, 1536, 33};
  int64_t rows = 0;
  for (auto m : splits) rows += m;
  auto opts = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kBFloat16);
  torch::manual_seed(41);
  auto x0 = torch::randn({rows, in}, opts), dy = torch::randn({rows, out}, opts) * 1e-2;
  std::vector<torch::Tensor> w0, b0;
  for (size_t i = 0; i < splits.size(); ++i) {
    w0.push_back(torch::randn({out, in}, opts) * 0.02);
    b0.push_back(torch::randn({out}, opts) * 0.1);
  }
  // Reference: autograd through F::linear per expert, bf16 gradients summed into fp32.
  auto xr = x0.clone().requires_grad_(true);
  std::vector<torch::Tensor> wr, br, ys;
  int64_t row = 0;
  for (size_t i = 0; i < splits.size(); ++i) {
    wr.push_back(w0[i].clone().requires_grad_(true));
    br.push_back(b0[i].clone().requires_grad_(true));
    ys.push_back(torch::nn::functional::linear(xr.narrow(0, row, splits[i]), wr[i], br[i]));
    row += splits[i];
  }
  auto yr = torch::cat(ys);
  yr.backward(dy);
  for (auto backend : {fp8::Bf16GroupedBackend::kCublasLt, fp8::Bf16GroupedBackend::kAtenMm}) {
    SCOPED_TRACE(int(backend));
    auto x = x0.clone().requires_grad_(true);
    std::vector<torch::Tensor> w, b, main_grads;
    for (size_t i = 0; i < splits.size(); ++i) {
      w.push_back(w0[i].clone().requires_grad_(true));
      b.push_back(b0[i].clone().requires_grad_(true));
      main_grads.push_back(torch::full({out, in}, 0.5, opts.dtype(torch::kFloat32)));
      w[i].mutable_grad() = main_grads[i];
    }
    auto y = fp8::grouped_linear(x, splits, w, b, {}, backend);
    y.backward(dy);
    double worst = std::max(relative_error(y, yr), relative_error(x.grad(), xr.grad()));
    for (size_t i = 0; i < splits.size(); ++i) {
      const auto want_w = wr[i].grad().defined() ? wr[i].grad().to(torch::kFloat32) : torch::zeros({out, in}, opts.dtype(torch::kFloat32));
      const auto dw = main_grads[i] - 0.5;
      if (splits[i] == 0) {
        EXPECT_EQ(dw.abs().max().item<float>(), 0.0f) << "idle expert " << i;
        EXPECT_EQ(b[i].grad().abs().max().item<float>(), 0.0f) << "idle expert " << i;
        continue;
      }
      EXPECT_TRUE(w[i].grad().is_same(main_grads[i])) << "the wgrad went into the main gradient";
      worst = std::max({worst, relative_error(dw, want_w), relative_error(b[i].grad(), br[i].grad())});
    }
    std::printf("[fp8-module] grouped bf16 (%s) vs per-expert F::linear: %.2e\n",
                backend == fp8::Bf16GroupedBackend::kCublasLt ? "cuBLASLt (default)" : "at::mm",
                worst);
    EXPECT_LT(worst, 1e-2);
  }
}

// Steady state of a training loop with routing that changes every call: no new GEMM plan for token
// counts within the buckets already seen, and no synchronising torch op.
TEST(GpuFp8, GroupedLinearCreatesNoPlanPerTokenCountAndDoesNotSynchronise) {
  REQUIRE_GPU();
  fp8::Fp8EngineOptions o;
  o.recipe = fp8::make_recipe(fp8::RecipeKind::kDelayed, fp8::Fp8Format::kHybrid);
  o.num_layers = 1;
  fp8::Fp8Engine engine(o, torch::Device(torch::kCUDA, 0));
  std::vector<fp8::Fp8Site*> sites;
  std::vector<std::shared_ptr<fp8::Fp8Site>> owned;
  for (int i = 0; i < 4; ++i) {
    owned.push_back(engine.add_site("decoder.layers.0.mlp.experts.linear_fc2.weight" + std::to_string(i), 0, 512, 1024));
    sites.push_back(owned.back().get());
  }
  auto opts = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kBFloat16);
  std::vector<torch::Tensor> w, b(4);
  for (int i = 0; i < 4; ++i) w.push_back((torch::randn({512, 1024}, opts) * 0.02).requires_grad_(true));
  auto run = [&](const std::vector<int64_t>& splits) {
    int64_t rows = 0;
    for (auto m : splits) rows += m;
    auto x = torch::randn({rows, 1024}, opts).requires_grad_(true);
    fp8::grouped_linear(x, splits, w, b, sites).backward(torch::randn({rows, 512}, opts));
  };
  auto& handle = fp8::grouped_gemm_resources().handle;
  run({1000, 1020, 1024, 1001});  // buckets: 1024 (fprop, dgrad, wgrad)
  const size_t plans = handle.cached_plans();
  auto& sync_debug = c10::cuda::warning_state();
  const auto mode = sync_debug.get_sync_debug_mode();
  sync_debug.set_sync_debug_mode(c10::cuda::SyncDebugMode::L_ERROR);
  try {
    run({1010, 999, 1023, 1017});
    run({1024, 1003, 1011, 1019});
  } catch (const std::exception& e) {
    sync_debug.set_sync_debug_mode(mode);
    FAIL() << "grouped linear synchronised: " << e.what();
  }
  sync_debug.set_sync_debug_mode(mode);
  EXPECT_EQ(handle.cached_plans(), plans) << "a new plan for token counts in buckets already seen";
  int64_t misses = 0;
  for (const auto& info : handle.plan_infos()) misses += info.bucket_misses;
  std::printf("[fp8-module] grouped GEMM plans: %zu for 12 calls of 4 token-count patterns, %lld bucket misses\n", plans,
              (long long)misses);
}

}  // namespace
}  // namespace fp8tron
