// --fp8-transposes recast against keep: casting the transposed FP8 copies again in backward (the
// weights'; fc2's input from fc1's output; QKV's and fc1's from the norm run again on the residual
// stream) gives the codes the kept copies hold, so a run
// trains bitwise as the run that keeps them, for every recipe, GPT (GeLU) and LLaMA-style
// (SwiGLU) MLPs, over two micro-batches (the weight cast again in each), and with recomputation.
#include <gtest/gtest.h>

#include "tests/identical_runs.h"
#include "tests/test_helpers.h"
#include "trainer/trainer.h"

namespace fp8tron {
namespace {

using testing::build;
using testing::expect_identical;
using testing::tiny_args;
using testing::with;

TrainResult train_with(const std::vector<std::string>& extra) {
  return testing::train_tiny_on_cpu(with({"--fp8-amax-history-len", "4"}, extra));
}

TEST(Fp8Transposes, RecastTrainsExactlyAsKept) {
  const std::vector<std::vector<std::string>> models = {
      {},
      {"--swiglu", "--normalization", "RMSNorm", "--disable-bias-linear", "--position-embedding-type", "rope"}};
  const std::vector<std::vector<std::string>> recipes = {{"--fp8-format", "hybrid", "--fp8-recipe", "delayed"},
                                                         {"--fp8-format", "hybrid", "--fp8-recipe", "tensorwise"},
                                                         {"--fp8-format", "e4m3", "--fp8-recipe", "blockwise"},
                                                         {"--fp8-format", "hybrid", "--fp8-recipe", "mxfp8"}};
  for (const auto& model : models) {
    for (const auto& recipe : recipes) {
      const std::string what = recipe[3] + (model.empty() ? " gpt" : " llama-style");
      const auto flags = with(model, recipe);
      const TrainResult kept = train_with(with(flags, {"--fp8-transposes", "keep"}));
      ASSERT_EQ(kept.losses.size(), 4u) << what;
      expect_identical(kept, train_with(with(flags, {"--fp8-transposes", "recast"})), what);
    }
  }
  // Recomputation replays the forward pass: the replay casts the weight again, and the backward
  // that follows casts the transposed copies from the replayed tensors.
  const std::vector<std::string> delayed = {"--fp8-format", "hybrid"};
  const std::vector<std::string> recompute = {"--recompute-granularity", "full", "--recompute-method", "uniform",
                                              "--recompute-num-layers", "1"};
  expect_identical(train_with(with(delayed, recompute)),
                   train_with(with(with(delayed, recompute), {"--fp8-transposes", "recast"})), "delayed recomputed");
}

TEST(Fp8Transposes, FlagIsCheckedAndNeedsFp8) {
  EXPECT_USER_ERROR(build(tiny_args({"--fp8-format", "hybrid", "--fp8-transposes", "drop"})), "fp8-transposes");
  EXPECT_TRUE(build(tiny_args({"--fp8-format", "hybrid", "--fp8-transposes", "recast"})).precision.fp8.enabled());
  EXPECT_FALSE(build(tiny_args({"--fp8-format", "hybrid", "--fp8-transposes", "recast"})).precision.fp8.keep_transposes);
  EXPECT_TRUE(build(tiny_args({"--fp8-format", "hybrid"})).precision.fp8.keep_transposes);
}

}  // namespace
}  // namespace fp8tron
