// GPU tests of the model and optimizer variants (ctest label `gpu`; skipped without a CUDA device,
// failing when the GPU disagrees): fp32 GPU runs match the CPU (multi-latent attention with
// YaRN, its padded value heads on the GPU, multi-token prediction, Muon, per-token loss, rotary
// variants), and FP8 through the MLA/MTP linears trains like bf16.
#include <gtest/gtest.h>

#include <cstdio>

#include "tests/test_helpers.h"
#include "trainer/trainer.h"

namespace fp8tron {
using namespace fp8tron::testing;

#define REQUIRE_GPU() \
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device"

Config variant_gpu_config(std::vector<std::string> extra) {
  auto args = tiny_args({"--hidden-size", "128", "--num-attention-heads", "4", "--seq-length", "128", "--micro-batch-size", "8",
                         "--global-batch-size", "16", "--vocab-size", "512", "--lr", "3e-3", "--attention-dropout", "0",
                         "--hidden-dropout", "0", "--log-interval", "1000", "--eval-iters", "0"});
  args.insert(args.end(), extra.begin(), extra.end());
  LaunchEnv env;
  return build_config(parse(args), env, /*gpu_available=*/true);
}

const std::vector<std::string> kMla = {"--multi-latent-attention", "--q-lora-rank", "64", "--kv-lora-rank", "64",
                                       "--qk-head-dim", "32", "--qk-pos-emb-head-dim", "16", "--v-head-dim", "32",
                                       "--qk-layernorm", "--rotary-scaling-factor", "4", "--mscale", "1", "--mscale-all-dim", "1",
                                       "--position-embedding-type", "rope", "--normalization", "RMSNorm", "--swiglu",
                                       "--disable-bias-linear"};

std::vector<std::string> with(std::vector<std::string> a, std::initializer_list<std::string> b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// Weights are drawn on the CPU from the seed: fp32 CPU and GPU runs start identical.
TEST(GpuVariants, Fp32MatchesCpu) {
  REQUIRE_GPU();
  const std::vector<std::vector<std::string>> cases = {
      with(kMla, {"--mtp-num-layers", "2"}),
      // A small --clip-grad keeps clipping active: Adam folds the coefficient into its fused
      // kernel on the GPU (the decoupled LR group too); Muon's domain has the caller scale instead.
      {"--optimizer", "muon", "--muon-fp32-matmul-prec", "high", "--calculate-per-token-loss", "--clip-grad", "0.05"},
      {"--decoupled-lr", "1e-2", "--clip-grad", "0.05", "--log-num-zeros-in-grad"},
      {"--position-embedding-type", "yarn", "--rotary-scaling-factor", "8"},
      {"--position-embedding-type", "rope", "--rotary-interleaved", "--use-rope-scaling", "--squared-relu",
       "--disable-bias-linear"},
      // The gated split's backward kernel and the rotary kernel on queries strided past their gates.
      {"--attention-output-gate", "--group-query-attention", "--num-query-groups", "2", "--position-embedding-type", "rope"}};
  for (auto flags : cases) {
    SCOPED_TRACE(flags.front());
    auto gpu = with(flags, {"--train-iters", "3", "--device", "cuda"});
    auto cpu = with(flags, {"--train-iters", "3", "--device", "cpu"});
    TrainResult a = train(variant_gpu_config(gpu)), b = train(variant_gpu_config(cpu));
    ASSERT_EQ(a.losses.size(), 3u);
    for (size_t i = 0; i < 3; ++i) EXPECT_NEAR(a.losses[i], b.losses[i], 2e-4 * b.losses[i]) << "iteration " << i + 1;
  }
}

// FP8 (delayed and blockwise hybrid) through the MLA projections (TEDuplicatedLinear included)
// and the MTP layers trains like bf16.
TEST(GpuVariants, Fp8MlaMtpTracksBf16) {
  REQUIRE_GPU();
  auto base = with(kMla, {"--mtp-num-layers", "1", "--bf16", "--train-iters", "60", "--device", "cuda"});
  const auto bf16 = train(variant_gpu_config(base));
  for (const char* recipe : {"delayed", "blockwise"}) {
    const auto fp8 = train(variant_gpu_config(with(base, {"--fp8-format", "hybrid", "--fp8-recipe", recipe})));
    const double a = bf16.losses.back(), b = fp8.losses.back();
    std::printf("[fp8-mla] tiny MLA+MTP model, 60 steps, %s hybrid: loss %.4f (bf16 %.4f, first %.4f)\n", recipe, b, a,
                fp8.losses.front());
    EXPECT_LT(b, 0.6 * fp8.losses.front());
    EXPECT_LT(std::abs(b - a) / a, 0.05);
  }
}

}  // namespace fp8tron
