// --moe-dispatch-fp8 on the GPU (label gpu; skipped without a CUDA device): the packed rows the
// grouped cast kernel makes (one segment) are the CPU reference's bit for bit, blockwise and
// MXFP8, and so are their values (the dequantize kernel); the experts' grouped input laid out from
// them on the GPU is the grouped cast of the same rows (codes, scale grids, and MXFP8's emulated
// dequantized copy); and a training run with the flag has the first loss of the run without it,
// bit for bit (blockwise on FP8 tensor cores, MXFP8 emulated), later losses close.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdio>

#include "fp8/packed_rows.h"
#include "fp8/recipe.h"
#include "tests/test_helpers.h"
#include "trainer/trainer.h"

namespace fp8tron {
namespace {
using namespace fp8tron::testing;

#define REQUIRE_GPU() \
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device"

std::shared_ptr<fp8::Fp8Engine> engine_on(fp8::RecipeKind kind, torch::Device device) {
  fp8::Fp8EngineOptions o;
  o.recipe = fp8::make_recipe(kind, fp8::Fp8Format::kE4M3);
  o.num_layers = 4;
  o.autotune_gemms = false;
  return std::make_shared<fp8::Fp8Engine>(o, device);
}

std::vector<fp8::Fp8Site*> sites_of(fp8::Fp8Engine& e, size_t n, int64_t in) {
  std::vector<fp8::Fp8Site*> sites;
  for (size_t i = 0; i < n; ++i)
    sites.push_back(e.add_site("decoder.layers.1.mlp.experts.linear_fc1.weight" + std::to_string(i), 1, 256, in).get());
  return sites;
}

class GpuPackedRows : public ::testing::TestWithParam<fp8::RecipeKind> {};

TEST_P(GpuPackedRows, MatchTheCpuReferenceAndTheGroupedCast) {
  REQUIRE_GPU();
  const auto cuda = torch::Device(torch::kCUDA, 0);
  constexpr int64_t kCols = 4160;  // 32.5 blocks of 128, 130 of 32
  const std::vector<int64_t> splits = {37, 0, 256, 5, 128};
  int64_t rows = 0;
  for (int64_t s : splits) rows += s;
  torch::manual_seed(2);
  auto x = (torch::randn({rows, kCols}) * torch::pow(2.0, torch::randint(-10, 10, {rows, 1}).to(torch::kFloat32)))
               .to(torch::kBFloat16);
  x[4].zero_();
  auto gpu = engine_on(GetParam(), cuda), cpu = engine_on(GetParam(), torch::kCPU);
  const auto packed = fp8::quantize_packed_rows(*gpu, x.to(cuda));
  EXPECT_TRUE(torch::equal(packed.cpu(), fp8::quantize_packed_rows(*cpu, x)));
  const auto values = fp8::dequantize_packed_rows(*gpu, packed, kCols);
  ASSERT_EQ(values.scalar_type(), torch::kBFloat16);
  EXPECT_TRUE(torch::equal(values.cpu(), fp8::dequantize_packed_rows(*cpu, packed.cpu(), kCols).to(torch::kBFloat16)));
  // The receiver: the grouped input from the packed rows is the grouped cast of the same rows.
  const auto sites = sites_of(*gpu, splits.size(), kCols);
  const auto want = fp8::quantize_grouped(*gpu, sites, fp8::TensorRole::kInput, x.to(cuda), splits, true, false, false);
  const auto got = fp8::quantize_grouped_from_packed(*gpu, sites, packed, values, splits, true);
  EXPECT_TRUE(torch::equal(got->data, want->data));
  EXPECT_TRUE(torch::equal(got->scale_inv, want->scale_inv));
  if (want->dequantized.defined()) EXPECT_TRUE(torch::equal(got->dequantized, want->dequantized));  // emulated (MXFP8)
  const auto t = fp8::quantize_grouped(*gpu, sites, fp8::TensorRole::kInput, values, splits, false, true, false);
  EXPECT_TRUE(torch::equal(got->data_t, t->data_t));
  EXPECT_TRUE(torch::equal(got->scale_inv_t, t->scale_inv_t));
}

INSTANTIATE_TEST_SUITE_P(BlockRecipes, GpuPackedRows,
                         ::testing::Values(fp8::RecipeKind::kBlockwise, fp8::RecipeKind::kMxfp8),
                         [](const auto& info) { return std::string(fp8::recipe_kind_name(info.param)); });

Config dispatch_config(const std::string& recipe, bool flag) {
  auto args = tiny_args({"--hidden-size", "128", "--num-attention-heads", "4", "--seq-length", "128",
                         "--micro-batch-size", "8", "--global-batch-size", "16", "--vocab-size", "512", "--lr", "3e-3",
                         "--attention-dropout", "0", "--hidden-dropout", "0", "--log-interval", "1000", "--eval-iters", "0",
                         "--num-experts", "8", "--moe-router-topk", "2", "--moe-ffn-hidden-size", "256",
                         "--moe-aux-loss-coeff", "1e-2", "--moe-router-dtype", "fp32", "--swiglu", "--disable-bias-linear",
                         "--moe-token-dispatcher-type", "alltoall", "--bf16", "--fp8-format", "e4m3", "--fp8-recipe",
                         recipe, "--deterministic-mode", "--train-iters", "20", "--device", "cuda"});
  if (flag) args.push_back("--moe-dispatch-fp8");
  return build_config(parse(args), LaunchEnv{}, /*gpu_available=*/true);
}

// One process (no exchange: the quantize-before-permute path alone) on the GPU, in deterministic
// mode (the same GEMM algorithms in both runs): the first loss is the bf16 dispatch's bit for bit.
TEST(GpuMoeDispatchFp8, FirstLossIsTheBf16DispatchsAndTrainingTracksIt) {
  REQUIRE_GPU();
  for (const std::string recipe : {"blockwise", "mxfp8"}) {
    const auto off = train(dispatch_config(recipe, false));
    const auto on = train(dispatch_config(recipe, true));
    ASSERT_EQ(on.losses.size(), off.losses.size());
    std::printf("[moe-dispatch-fp8] %s: first loss %.6f / %.6f, last %.6f / %.6f (with / without)\n", recipe.c_str(),
                on.losses.front(), off.losses.front(), on.losses.back(), off.losses.back());
    EXPECT_EQ(on.losses.front(), off.losses.front()) << recipe;
    EXPECT_LT(std::abs(on.losses.back() - off.losses.back()) / off.losses.back(), 1e-2) << recipe;
    EXPECT_LT(on.losses.back(), 0.8 * on.losses.front()) << recipe;
  }
}

}  // namespace
}  // namespace fp8tron
