// Reliability on the GPU (ctest label gpu; skipped without a CUDA device): the NaN check's
// asynchronous copy of the loss and gradient norm stops the run at the right iteration, the rerun
// engine's re-run in place reproduces an iteration bit for bit (the CUDA generator's offset and
// the FP8 scaling state restored) and saves the state before a reproducible NaN, and the
// FP8 cast statistics of the native kernels -- whose norm, GeLU and SwiGLU prologues are fused into
// the casts, which record_cast_stats re-applies -- agree with the CPU emulation's.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <tuple>

#include "tests/checkpoint/temp_dir.h"
#include "core/text.h"
#include "tests/test_helpers.h"
#include "checkpoint/checkpoint_dir.h"
#include "trainer/logging/tensorboard_writer.h"
#include "trainer/trainer.h"

namespace fp8tron {
namespace {
using namespace fp8tron::testing;
using checkpoint::testing::TempDir;

#define REQUIRE_GPU() \
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device"

Config config_on(const std::string& device, std::vector<std::string> extra) {
  auto args = tiny_args({"--hidden-size", "128", "--num-attention-heads", "4", "--seq-length", "128",
                         "--micro-batch-size", "8", "--global-batch-size", "16", "--vocab-size", "512", "--lr", "3e-3",
                         "--attention-dropout", "0", "--hidden-dropout", "0", "--log-interval", "1000", "--eval-iters", "0",
                         "--bf16", "--device", device});
  args.insert(args.end(), extra.begin(), extra.end());
  return build_config(parse(args), LaunchEnv{}, /*gpu_available=*/true);
}

TEST(GpuReliability, ANanStopsTheRunAtItsIterationAndNamesTheParameter) {
  REQUIRE_GPU();
  TempDir dir;
  EXPECT_USER_ERROR(train(config_on("cuda", {"--train-iters", "8", "--save", dir.path(), "--save-interval", "2",
                                             "--rerun-mode", "disabled", "--fp8tron-test-inject-nan",
                                             "5:decoder.layers.1.mlp.linear_fc1.weight"})),
                    "iteration 5: the gradient norm is NaN (the first parameter whose gradient is not finite: "
                    "decoder.layers.1.mlp.linear_fc1.weight)");
  EXPECT_EQ(checkpoint::read_tracker(dir.path())->iteration, 4);
}

// A mixture-of-experts model: 4 routed experts in the second layer (grouped GEMMs on the GPU).
const std::vector<std::string> kMoe = {"--num-experts", "4", "--moe-ffn-hidden-size", "128", "--moe-layer-freq",
                                       "([0]+[1])", "--moe-router-topk", "2"};

TEST(GpuReliability, ANanInAnExpertsGradientStopsTheRunAndNamesTheExpert) {
  REQUIRE_GPU();
  TempDir dir;
  std::vector<std::string> extra = {"--train-iters", "8", "--save", dir.path(), "--save-interval", "2", "--rerun-mode",
                                    "disabled", "--fp8tron-test-inject-nan",
                                    "5:decoder.layers.1.mlp.experts.linear_fc1.weight2"};
  extra.insert(extra.end(), kMoe.begin(), kMoe.end());
  EXPECT_USER_ERROR(train(config_on("cuda", extra)), "iteration 5: the gradient norm is NaN (the first parameter whose "
                                                     "gradient is not finite: decoder.layers.1.mlp.experts.linear_fc1.weight2)");
  EXPECT_EQ(checkpoint::read_tracker(dir.path())->iteration, 4);
}

std::vector<std::string> joined(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// From the second iteration on, every iteration runs twice (an injected transient error on the
// non-fatal spiky-loss check) and the re-run's step is applied: with the state fully restored the
// run is bitwise the run without re-runs (deterministic mode: no atomics in the kernels).
TEST(GpuReliability, ARerunInPlaceReproducesTheIterationBitForBit) {
  REQUIRE_GPU();
  const std::vector<std::string> rerun_every_iteration = {
      "--no-check-for-nan-in-loss-and-grad", "--check-for-spiky-loss", "--check-for-large-grads",
      "--error-injection-rate", "1", "--error-injection-type", "transient_error"};
  for (const auto& variant : std::vector<std::vector<std::string>>{
           {"--hidden-dropout", "0.1", "--attention-dropout", "0.1"},
           {"--hidden-dropout", "0.1", "--fp8-format", "hybrid", "--fp8-recipe", "delayed", "--fp8-amax-history-len", "4"},
           joined(kMoe, {"--moe-router-score-function", "sigmoid", "--moe-router-enable-expert-bias"})}) {
    SCOPED_TRACE(join(variant, " "));
    const auto base = joined(variant, {"--train-iters", "5", "--deterministic-mode"});
    const TrainResult plain =
        train(config_on("cuda", joined(base, {"--rerun-mode", "disabled"})), TrainOptions{.collect_final_weights = true});
    const TrainResult rerun =
        train(config_on("cuda", joined(base, rerun_every_iteration)), TrainOptions{.collect_final_weights = true});
    EXPECT_EQ(plain.losses, rerun.losses);
    ASSERT_EQ(plain.final_weights.size(), rerun.final_weights.size());
    for (const auto& [name, w] : plain.final_weights) EXPECT_TRUE(torch::equal(w, rerun.final_weights.at(name))) << name;
  }
}

// --rerun-mode validate_results (the default) on the GPU: a NaN reproduced in place saves the state
// before its iteration and ends with Megatron's exit 16.
TEST(GpuReliability, AReproducibleNanSavesTheStateBeforeItAndExits16) {
  REQUIRE_GPU();
  TempDir dir;
  try {
    train(config_on("cuda", {"--train-iters", "8", "--save", dir.path(), "--save-interval", "2", "--fp8-format", "hybrid",
                             "--fp8tron-test-inject-nan", "5:decoder.layers.1.mlp.linear_fc1.weight"}));
    ADD_FAILURE() << "the run did not end";
  } catch (const RunEnd& e) {
    EXPECT_EQ(e.status(), 16) << e.what();
    EXPECT_NE(std::string(e.what()).find("saved the checkpoint of iteration 4"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("decoder.layers.1.mlp.linear_fc1.weight"), std::string::npos) << e.what();
  }
  EXPECT_EQ(checkpoint::read_tracker(dir.path())->iteration, 4);
}

// Per "<site>/<role>/<stat>": the values of the steps TensorBoard logged.
std::map<std::string, std::vector<double>> fp8_stats(const std::string& device, const std::vector<std::string>& recipe) {
  TempDir dir;
  std::vector<std::string> extra = {"--train-iters", "2", "--tensorboard-dir", dir.path(), "--tensorboard-log-interval",
                                    "1", "--log-fp8-stats-to-tensorboard"};
  extra.insert(extra.end(), recipe.begin(), recipe.end());
  train(config_on(device, extra));
  std::map<std::string, std::vector<double>> out;
  for (const auto& e : std::filesystem::directory_iterator(dir.path()))
    for (const auto& s : read_tensorboard_scalars(e.path().string()))
      if (s.tag.rfind("fp8/", 0) == 0) out[s.tag.substr(4)].push_back(s.value);
  return out;
}

TEST(GpuReliability, Fp8CastStatisticsOfTheFusedKernelsMatchTheCpuEmulation) {
  REQUIRE_GPU();
  for (const auto& recipe : std::vector<std::vector<std::string>>{{"--fp8-format", "hybrid"},
                                                                  {"--fp8-format", "hybrid", "--swiglu"},
                                                                  {"--fp8-format", "hybrid", "--fp8-recipe", "tensorwise"}}) {
    SCOPED_TRACE(join(recipe, " "));
    const auto gpu = fp8_stats("cuda", recipe), cpu = fp8_stats("cpu", recipe);
    ASSERT_FALSE(cpu.empty());
    ASSERT_EQ(gpu.size(), cpu.size());
    for (const auto& [tag, values] : cpu) {
      ASSERT_TRUE(gpu.count(tag)) << tag;
      ASSERT_EQ(gpu.at(tag).size(), values.size()) << tag;
      // The first step: the same weights and data, bf16 on both; kernels differ in rounding only.
      const double want = values[0], got = gpu.at(tag)[0];
      if (tag.size() > 5 && tag.compare(tag.size() - 5, 5, "/amax") == 0)
        EXPECT_NEAR(got, want, 0.05 * want) << tag;
      else if (tag.find("/elements") != std::string::npos)
        EXPECT_EQ(got, want) << tag;
      else  // underflows, overflows: counts of a few borderline elements may differ
        EXPECT_NEAR(got, want, 0.02 * gpu.at(tag.substr(0, tag.rfind('/')) + "/elements")[0] + 2) << tag;
    }
  }
}

// The experts' grouped casts: the GPU may route a few tokens differently from the CPU (bf16
// router logits), so per role the sums over the experts are compared: the elements cast (every
// routed token once per expert it went to: the same on both), the largest amax, the under- and
// overflows within a few per mille of the elements.
TEST(GpuReliability, Fp8CastStatisticsOfTheGroupedExpertCastsMatchTheCpuEmulation) {
  REQUIRE_GPU();
  std::vector<std::string> recipe = {"--fp8-format", "hybrid"};
  recipe.insert(recipe.end(), kMoe.begin(), kMoe.end());
  const auto gpu = fp8_stats("cuda", recipe), cpu = fp8_stats("cpu", recipe);
  auto experts = [](const std::map<std::string, std::vector<double>>& stats, const std::string& role, const std::string& stat) {
    double sum = 0, max = 0;
    int sites = 0;
    for (const auto& [tag, values] : stats)
      if (tag.find(".experts.") != std::string::npos && tag.find("/" + role + "/" + stat) != std::string::npos) {
        sum += values[0];
        max = std::max(max, values[0]);
        ++sites;
      }
    return std::make_tuple(sum, max, sites);
  };
  for (const std::string role : {"input", "weight", "grad_output"}) {
    SCOPED_TRACE(role);
    const auto [cpu_elements, cpu_e_max, cpu_sites] = experts(cpu, role, "elements");
    const auto [gpu_elements, gpu_e_max, gpu_sites] = experts(gpu, role, "elements");
    ASSERT_GT(cpu_sites, 0);
    EXPECT_EQ(gpu_sites, cpu_sites);
    EXPECT_EQ(gpu_elements, cpu_elements);
    const double cpu_amax = std::get<1>(experts(cpu, role, "amax")), gpu_amax = std::get<1>(experts(gpu, role, "amax"));
    EXPECT_NEAR(gpu_amax, cpu_amax, 0.05 * cpu_amax);
    for (const std::string stat : {"underflows", "overflows"})
      EXPECT_NEAR(std::get<0>(experts(gpu, role, stat)), std::get<0>(experts(cpu, role, stat)), 0.005 * cpu_elements + 2)
          << stat;
  }
}

}  // namespace
}  // namespace fp8tron
