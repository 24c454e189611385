// --cuda-graph-impl full_iteration on the GPU (ctest label `gpu`): each step's forward and backward
// passes captured as one CUDA graph after the warm-up steps and replayed (trainer/step_graph.h).
// A replay runs the captured kernels on the captured addresses, so a step that replays must equal
// the eager step bit for bit where the eager steps themselves repeat (--deterministic-mode): the
// staged micro-batches, the first wgrad writes, the accumulated gradients, dropout's random
// streams and the loss outputs are all checked through the losses and the final weights.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "tests/checkpoint/temp_dir.h"
#include "tests/test_helpers.h"
#include "trainer/trainer.h"

namespace fp8tron {
using namespace fp8tron::testing;
using checkpoint::testing::TempDir;

namespace {

#define REQUIRE_GPU() \
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device"

constexpr int64_t kIterations = 8, kWarmup = 2;

std::vector<std::string> graph_test_args(const std::vector<std::string>& model, bool graphed) {
  auto args = tiny_args({"--hidden-size", "128", "--num-attention-heads", "4", "--seq-length", "128",
                         "--micro-batch-size", "8", "--global-batch-size", "16", "--vocab-size", "512", "--lr", "3e-3",
                         "--log-interval", "1000", "--eval-iters", "0", "--device", "cuda", "--bf16", "--train-iters",
                         std::to_string(kIterations)});
  args.insert(args.end(), model.begin(), model.end());
  if (graphed)
    for (const char* a : {"--cuda-graph-impl", "full_iteration", "--cuda-graph-warmup-steps", "2"}) args.push_back(a);
  return args;
}

Config graph_test_config(const std::vector<std::string>& model, bool graphed) {
  return build_config(parse(graph_test_args(model, graphed)), LaunchEnv{}, /*gpu_available=*/true);
}

struct Runs {
  TrainResult eager, graphed;
};

Runs run_both(const std::vector<std::string>& model) {
  const TrainOptions weights{.collect_final_weights = true};
  Runs r{train(graph_test_config(model, false), weights), train(graph_test_config(model, true), weights)};
  EXPECT_EQ(r.eager.cuda_graph_replays, 0);
  EXPECT_EQ(r.graphed.cuda_graph_replays, kIterations - kWarmup) << "the steps after the warm-up replay the graph";
  return r;
}

void expect_bitwise(const Runs& r) {
  ASSERT_EQ(r.eager.losses.size(), size_t(kIterations));
  EXPECT_EQ(r.graphed.losses, r.eager.losses) << "the replayed steps differ from the eager ones";
  ASSERT_EQ(r.graphed.final_weights.size(), r.eager.final_weights.size());
  for (const auto& [name, w] : r.eager.final_weights)
    EXPECT_TRUE(torch::equal(w, r.graphed.final_weights.at(name))) << name << " differs after the replayed steps";
}

}  // namespace

// GPT-2-style (learned positions, LayerNorm, GeLU MLP with biases, tied output layer), two
// micro-batches per step: the first wgrad writes and the accumulation run inside the graph.
TEST(GpuCudaGraph, ReplayedStepsEqualEagerStepsBitwise) {
  REQUIRE_GPU();
  expect_bitwise(run_both({"--deterministic-mode"}));
}

// LLaMA-style: RoPE, RMSNorm, SwiGLU, GQA, no biases, untied output layer.
TEST(GpuCudaGraph, LlamaStyleReplaysBitwise) {
  REQUIRE_GPU();
  expect_bitwise(run_both({"--deterministic-mode", "--position-embedding-type", "rope", "--normalization", "RMSNorm",
                           "--swiglu", "--num-query-groups", "2", "--disable-bias-linear",
                           "--untie-embeddings-and-output-weights"}));
}

// Dropout draws new masks in every replay (the graph advances the generator as the eager step
// does), so the replayed steps still equal the eager ones.
TEST(GpuCudaGraph, DropoutDrawsNewMasksInEveryReplay) {
  REQUIRE_GPU();
  expect_bitwise(run_both({"--deterministic-mode", "--hidden-dropout", "0.1", "--attention-dropout", "0.1"}));
}

// Evaluation runs eagerly between replays and reads the weights the replays trained.
TEST(GpuCudaGraph, EvaluationBetweenReplays) {
  REQUIRE_GPU();
  const Runs r = run_both({"--deterministic-mode", "--eval-interval", "4", "--eval-iters", "2"});
  expect_bitwise(r);
  EXPECT_EQ(r.graphed.last_validation_loss, r.eager.last_validation_loss);
}

// The default kernels (cuDNN attention, whose backward is not deterministic): the replayed steps
// stay within the eager runs' own run-to-run difference.
TEST(GpuCudaGraph, DefaultKernelsStayWithinRunToRunNoise) {
  REQUIRE_GPU();
  const TrainResult again = train(graph_test_config({}, false));
  const Runs r = run_both({});
  double noise = 0;
  for (int64_t i = 0; i < kIterations; ++i) noise = std::max(noise, std::abs(r.eager.losses[i] - again.losses[i]));
  std::printf("[cuda-graph] eager run-to-run loss difference %.3g\n", noise);
  for (int64_t i = 0; i < kIterations; ++i) {
    const double bound = std::min(std::max(4 * noise, 1e-7 * std::abs(r.eager.losses[i])), 1e-4 * std::abs(r.eager.losses[i]));
    EXPECT_LE(std::abs(r.graphed.losses[i] - r.eager.losses[i]), bound) << "iteration " << i + 1;
  }
}

// A batch-size rampup changes the number of micro-batches per step: the new count warms up
// eagerly again before its own capture (its accumulating GEMMs create their plans outside the
// capture), and the replays of both counts equal the eager steps. --rampup-batch-size 8 8 32
// with micro-batches of 8: 4 steps of one micro-batch (2 eager, 2 replayed), then 8 of two
// (2 eager, 6 replayed).
TEST(GpuCudaGraph, ARampupWarmsUpEachMicroBatchCountBeforeItsCapture) {
  REQUIRE_GPU();
  auto config = [](bool graphed) {
    auto args = graph_test_args({"--deterministic-mode", "--train-samples", std::to_string(4 * 8 + 8 * 16),
                                 "--rampup-batch-size", "8", "8", "32"},
                                graphed);
    for (auto at = std::find(args.begin(), args.end(), "--train-iters"); at != args.end();
         at = std::find(args.begin(), args.end(), "--train-iters"))
      args.erase(at, at + 2);
    return build_config(parse(args), LaunchEnv{}, /*gpu_available=*/true);
  };
  const TrainOptions weights{.collect_final_weights = true};
  const Config graphed = config(true);
  ASSERT_EQ(graphed.training.train_iters, 12);
  const Runs r{train(config(false), weights), train(graphed, weights)};
  EXPECT_EQ(r.graphed.cuda_graph_replays, 2 + 6) << "each micro-batch count replays after its own warm-up";
  ASSERT_EQ(r.eager.losses.size(), size_t(12));
  EXPECT_EQ(r.graphed.losses, r.eager.losses);
  for (const auto& [name, w] : r.eager.final_weights)
    EXPECT_TRUE(torch::equal(w, r.graphed.final_weights.at(name))) << name;
}

// FP8 steps replay bitwise under every recipe: the delayed scales and amax histories are updated
// in place after each replay (the next replay casts with the new scales), current scaling's amaxes
// and scales stay on the device, and the weights' casts, cached for the step, are redone by each
// replay's first micro-batch from the weights the optimizer just changed. MXFP8 runs emulated on
// Hopper (torch's GEMMs inside the graph).
TEST(GpuCudaGraph, Fp8StepsReplayBitwiseUnderEveryRecipe) {
  REQUIRE_GPU();
  for (const char* recipe : {"delayed", "tensorwise", "blockwise", "mxfp8"}) {
    SCOPED_TRACE(recipe);
    expect_bitwise(run_both({"--deterministic-mode", "--fp8-format", "hybrid", "--fp8-recipe", recipe}));
  }
}

// LLaMA-style with the transposed copies cast again in backward (--fp8-transposes recast): the
// norm's rebuild of QKV's and fc1's inputs and the SwiGLU prologue run inside the graph.
TEST(GpuCudaGraph, Fp8RecastLlamaStyleReplaysBitwise) {
  REQUIRE_GPU();
  expect_bitwise(run_both({"--deterministic-mode", "--fp8-format", "hybrid", "--fp8-transposes", "recast",
                           "--position-embedding-type", "rope", "--normalization", "RMSNorm", "--swiglu",
                           "--num-query-groups", "2", "--disable-bias-linear", "--untie-embeddings-and-output-weights",
                           "--fp8-amax-history-len", "4", "--fp8-amax-compute-algo", "max"}));
}

// The steps that log the FP8 casts' statistics run eagerly (the host reads them): with statistics
// every 3rd step, steps 3 and 6 are eager, 1 and 2 warm up, and 4, 5, 7, 8 replay; all equal the
// eager run's.
TEST(GpuCudaGraph, Fp8StatisticsStepsRunEagerlyBetweenReplays) {
  REQUIRE_GPU();
  TempDir dir;
  auto config = [&](bool graphed) {
    const std::vector<std::string> model = {"--deterministic-mode", "--fp8-format", "hybrid",
                                            "--log-fp8-stats-to-tensorboard", "--tensorboard-dir",
                                            dir.path() + (graphed ? "/graphed" : "/eager"),
                                            "--tensorboard-log-interval", "3"};
    const auto args = graph_test_args(model, graphed);
    return build_config(parse(args), LaunchEnv{}, /*gpu_available=*/true);
  };
  const TrainOptions weights{.collect_final_weights = true};
  const Runs r{train(config(false), weights), train(config(true), weights)};
  EXPECT_EQ(r.graphed.cuda_graph_replays, 4) << "steps 3 and 6 log statistics and run eagerly";
  expect_bitwise(r);
}

}  // namespace fp8tron
