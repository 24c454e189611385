// GPU tests (ctest label `gpu`): skipped where no CUDA device is visible; run on the GPU machine.
#include <gtest/gtest.h>

#include <cmath>

#include "models/gpt_model.h"
#include "test_helpers.h"
#include "trainer/trainer.h"

namespace fp8tron {
using namespace fp8tron::testing;

#define REQUIRE_GPU() \
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device"

Config gpu_config(std::initializer_list<std::string> extra) {
  auto args = tiny_args({"--hidden-size", "128", "--num-attention-heads", "4", "--seq-length", "128",
                         "--micro-batch-size", "8", "--global-batch-size", "16", "--vocab-size", "512", "--lr", "3e-3",
                         "--attention-dropout", "0", "--hidden-dropout", "0", "--log-interval", "1000", "--eval-iters", "0"});
  args.insert(args.end(), extra.begin(), extra.end());
  LaunchEnv env;
  return build_config(parse(args), env, /*gpu_available=*/true);
}

// Weights are drawn on the CPU from the seed, so fp32 CPU and GPU runs start identical and
// their losses agree to fp32 rounding (TF32 is off by default).
TEST(Gpu, Fp32MatchesCpu) {
  REQUIRE_GPU();
  Config gpu = gpu_config({"--train-iters", "3", "--device", "cuda"});
  Config cpu = gpu_config({"--train-iters", "3", "--device", "cpu"});
  TrainResult a = train(gpu), b = train(cpu);
  ASSERT_EQ(a.losses.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_NEAR(a.losses[i], b.losses[i], 2e-4 * b.losses[i]) << "iteration " << i + 1;
}

TEST(Gpu, Bf16TrainingConvergesAndUsesCudnnAttention) {
  REQUIRE_GPU();
  Config c = gpu_config({"--train-iters", "150", "--bf16", "--device", "cuda"});
  EXPECT_EQ(attention_backend_name(c.model, 8, torch::Device(torch::kCUDA, 0), torch::kBFloat16), "cuDNN fused attention");
  TrainResult r = train(c);
  EXPECT_LT(r.losses.back(), 2.5);
  EXPECT_LT(r.losses.back(), r.losses.front() - 3.0);
}

TEST(Gpu, Bf16GqaRopeSwigluTrains) {
  REQUIRE_GPU();
  Config c = gpu_config({"--train-iters", "100", "--bf16", "--device", "cuda", "--group-query-attention",
                         "--num-query-groups", "2", "--position-embedding-type", "rope", "--swiglu", "--normalization",
                         "RMSNorm", "--disable-bias-linear", "--untie-embeddings-and-output-weights", "--qk-layernorm"});
  TrainResult r = train(c);
  EXPECT_LT(r.losses.back(), r.losses.front() - 2.5);
}

}  // namespace fp8tron
