// GPU tests (ctest label `gpu`): skipped where no CUDA device is visible.
#include <gtest/gtest.h>

#include <ATen/Context.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "models/gpt_model.h"
#include "models/linear/main_grads.h"
#include "tests/test_helpers.h"
#include "checkpoint/file_io.h"
#include "trainer/determinism.h"
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

// Resume on the GPU: 20 iterations straight (twice) vs 10 + save + load + 10.
//   kBitwise: the run must repeat bit for bit (--deterministic-mode) and the resumed run must equal
//             the straight one bit for bit.
//   kWithinRunToRunNoise: default kernels (cuDNN attention's backward, atomics) are not
//             deterministic, so two straight runs differ a little; the resumed run must stay
//             within that run-to-run difference (4x its largest value, and never more than 1e-4
//             relative: a resume that loses the optimizer state, the schedule or the RNG shows up
//             as far more). A difference is a failure, never a skip.
enum class ResumeCheck { kBitwise, kWithinRunToRunNoise };

void check_gpu_resume(std::initializer_list<std::string> model, ResumeCheck check) {
  const std::string dir = temp_file("gpu_ckpt", "");
  std::remove(dir.c_str());
  auto config = [&](std::vector<std::string> extra) {
    auto args = tiny_args({"--hidden-size", "128", "--num-attention-heads", "4", "--seq-length", "128",
                           "--micro-batch-size", "8", "--global-batch-size", "16", "--vocab-size", "512", "--lr", "3e-3",
                           "--log-interval", "1000", "--eval-iters", "0", "--device", "cuda", "--train-iters", "20"});
    args.insert(args.end(), model.begin(), model.end());
    args.insert(args.end(), extra.begin(), extra.end());
    return build_config(parse(args), LaunchEnv{}, /*gpu_available=*/true);
  };
  const TrainOptions weights{.collect_final_weights = true};
  TrainResult a = train(config({}), weights), b = train(config({}), weights);
  train(config({"--exit-interval", "10", "--save", dir}));
  TrainResult resumed = train(config({"--load", dir}), weights);
  checkpoint::remove_tree(dir);  // not std::filesystem::remove_all: see file_io.h
  ASSERT_EQ(resumed.losses.size(), 10u);
  const std::vector<double> tail(a.losses.begin() + 10, a.losses.end());
  if (check == ResumeCheck::kBitwise) {
    EXPECT_EQ(a.losses, b.losses) << "two identical runs differ";
    EXPECT_EQ(a.final_weights_sample, b.final_weights_sample) << "two identical runs differ";
    EXPECT_EQ(tail, resumed.losses) << "resumed run differs from the straight run";
    EXPECT_EQ(a.final_weights_sample, resumed.final_weights_sample);
    return;
  }
  double noise = 0;
  for (size_t i = 0; i < a.losses.size(); ++i) noise = std::max(noise, std::abs(a.losses[i] - b.losses[i]));
  std::printf("[gpu-resume] run-to-run loss difference %.3g\n", noise);
  for (size_t i = 0; i < tail.size(); ++i) {
    const double bound = std::min(std::max(4 * noise, 1e-7 * std::abs(tail[i])), 1e-4 * std::abs(tail[i]));
    EXPECT_LE(std::abs(resumed.losses[i] - tail[i]), bound)
        << "resumed iteration " << 11 + i << ": " << resumed.losses[i] << " vs straight " << tail[i]
        << " (run-to-run difference " << noise << ")";
  }
}

// FP8 through the whole trainer (two micro-batches per step: the wgrad overwrite-then-accumulate
// path, delayed-scaling updates, fused GeLU both ways): trains like bf16 on the tiny model.
TEST(Gpu, Fp8TrainingTracksBf16) {
  REQUIRE_GPU();
  const auto bf16 = train(gpu_config({"--bf16", "--train-iters", "60"}));
  for (const char* recipe : {"delayed", "tensorwise"}) {
    const auto fp8 = train(gpu_config({"--bf16", "--train-iters", "60", "--fp8-format", "hybrid", "--fp8-recipe", recipe}));
    const double a = bf16.losses.back(), b = fp8.losses.back();
    std::printf("[fp8-module] tiny model, 60 steps, %s: loss %.4f (bf16 %.4f, first %.4f)\n", recipe, b, a, fp8.losses.front());
    EXPECT_LT(b, 0.6 * fp8.losses.front());
    EXPECT_LT(std::abs(b - a) / a, 0.03);
  }
}

TEST(Gpu, CheckpointResumeIsExactFp32) {
  REQUIRE_GPU();
  check_gpu_resume({"--attention-dropout", "0", "--hidden-dropout", "0", "--deterministic-mode"}, ResumeCheck::kBitwise);
}

TEST(Gpu, CheckpointResumeIsExactBf16WithDropout) {
  REQUIRE_GPU();
  check_gpu_resume({"--bf16", "--hidden-dropout", "0.1", "--attention-dropout", "0.1", "--deterministic-mode"},
                   ResumeCheck::kBitwise);
}

TEST(Gpu, CheckpointResumeStaysWithinRunToRunNoiseWithDefaultKernels) {
  REQUIRE_GPU();
  check_gpu_resume({"--bf16", "--hidden-dropout", "0.1", "--attention-dropout", "0.1"},
                   ResumeCheck::kWithinRunToRunNoise);
}

// --deterministic-mode: cuDNN attention (no deterministic backward) gives way to flash attention
// with its deterministic backward; runs repeat and resume bit for bit, dropout included.
TEST(Gpu, DeterministicModeRepeatsAndResumesBitwise) {
  REQUIRE_GPU();
  Config c = gpu_config({"--train-iters", "1", "--bf16", "--device", "cuda", "--deterministic-mode"});
  const torch::Device gpu(torch::kCUDA, 0);
  configure_attention_backends();
  {
    DeterministicMode mode(gpu);
    EXPECT_TRUE(at::globalContext().deterministicAlgorithms());
    EXPECT_EQ(attention_backend_name(c.model, 8, gpu, torch::kBFloat16), "flash attention");
    const char* workspace = std::getenv("CUBLAS_WORKSPACE_CONFIG");
    ASSERT_NE(workspace, nullptr);
    EXPECT_TRUE(std::string(workspace) == ":4096:8" || std::string(workspace) == ":16:8") << workspace;
  }
  EXPECT_FALSE(at::globalContext().deterministicAlgorithms());
  EXPECT_EQ(attention_backend_name(c.model, 8, gpu, torch::kBFloat16), "cuDNN fused attention");
  check_gpu_resume({"--bf16", "--deterministic-mode", "--hidden-dropout", "0.1", "--attention-dropout", "0.1",
                    "--vocab-size", "32"},
                   ResumeCheck::kBitwise);
}

// A step's first wgrad GEMM writes the bf16 linears' main gradients instead of adding to zeros
// (models/linear/main_grads.h); the second micro-batch adds. Against the run that zeroes every
// gradient: the same weights after three steps, with biases (BGRADB writes the bias's main
// gradient) and without (GeLU MLP vs SwiGLU, tied vs untied output layer), and the path ran for
// every linear weight and bias of every step.
TEST(Gpu, FirstWgradWriteMatchesZeroingAndAccumulating) {
  REQUIRE_GPU();
  struct Variant {
    std::vector<std::string> flags;
    uint64_t written_per_step;  // of the 2 layers' linears (and the untied output layer)
  };
  const std::vector<Variant> variants = {
      {{}, 2 * 8},
      {{"--disable-bias-linear", "--swiglu", "--untie-embeddings-and-output-weights"}, 2 * 4 + 1}};
  for (const auto& v : variants) {
    std::vector<std::string> args = {"--train-iters", "3", "--bf16", "--device", "cuda", "--deterministic-mode"};
    args.insert(args.end(), v.flags.begin(), v.flags.end());
    auto argv = tiny_args({"--hidden-size", "128", "--num-attention-heads", "4", "--seq-length", "128",
                           "--micro-batch-size", "8", "--global-batch-size", "16", "--vocab-size", "512", "--lr",
                           "3e-3", "--attention-dropout", "0", "--hidden-dropout", "0", "--log-interval", "1000",
                           "--eval-iters", "0"});
    argv.insert(argv.end(), args.begin(), args.end());
    LaunchEnv env;
    const Config c = build_config(parse(argv), env, /*gpu_available=*/true);
    const TrainOptions writes{.collect_final_weights = true, .main_grad_first_writes = true};
    const TrainOptions zeroes{.collect_final_weights = true, .main_grad_first_writes = false};
    const TrainResult written = train(c, writes);
    EXPECT_EQ(written.main_grad_first_writes, 3 * v.written_per_step) << "first writes per step";
    const TrainResult zeroed = train(c, zeroes);
    EXPECT_EQ(zeroed.main_grad_first_writes, 0u) << "switched off, yet first writes ran";
    ASSERT_EQ(written.final_weights.size(), zeroed.final_weights.size());
    for (const auto& [name, w] : written.final_weights) {
      const auto diff = (w - zeroed.final_weights.at(name)).abs().max().item<double>();
      // Adam moves each weight by about lr (3e-3) per step: a lost or stale micro-batch gradient
      // shows at that size; fp32 summation order at 1e-6 of it.
      EXPECT_LT(diff, 1e-5) << name;
    }
    for (size_t i = 0; i < written.losses.size(); ++i)
      EXPECT_NEAR(written.losses[i], zeroed.losses[i], 1e-4 * zeroed.losses[i]) << "iteration " << i + 1;
  }
}

}  // namespace fp8tron
