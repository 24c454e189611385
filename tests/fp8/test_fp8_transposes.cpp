// --fp8-transposes recast against keep: casting the transposed FP8 copies again in backward (the
// weights'; fc2's input from fc1's output; QKV's and fc1's from the norm run again on the residual
// stream) gives the codes the kept copies hold, so a run
// trains bitwise as the run that keeps them, for every recipe, GPT (GeLU) and LLaMA-style
// (SwiGLU) MLPs, over two micro-batches (the weight cast again in each), and with recomputation.
#include <gtest/gtest.h>

#include "fp8/fp8_linear.h"
#include "models/gpt_model.h"
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

// The attention's output projection keeps no FP8 copy of its input under recast where the
// attention keeps that input (its own output) for its backward pass, so FP8 holds nothing there
// that bf16 does not; where the attention does not keep it (recomputed, or scaled by the output
// gate first), the projection keeps its copy.
TEST(Fp8Transposes, OutputProjectionRecastsFromTheAttentionOutput) {
  auto projection_keeps_copy = [](const std::vector<std::string>& extra, bool recast) {
    const Config c = build(with(tiny_args({"--attention-dropout", "0", "--hidden-dropout", "0"}), extra));
    fp8::Fp8EngineOptions o;
    o.recipe = fp8::make_recipe(fp8::RecipeKind::kDelayed, fp8::Fp8Format::kHybrid);
    o.num_layers = c.model.num_layers;
    o.keep_transposes = !recast;
    const auto engine = std::make_shared<fp8::Fp8Engine>(o, torch::Device(torch::kCPU));
    GptModel model(c.model, TensorParallelContext{make_self_communicator("tp", 0), 0, 1, false}, StageSpec::whole(c.model),
                   engine);
    auto* attention = dynamic_cast<SelfAttentionImpl*>(model->named_modules()["decoder.layers.0.self_attention"].get());
    EXPECT_NE(attention, nullptr);
    model->train();
    const auto x = torch::randn({8, 2, c.model.hidden_size}, torch::requires_grad());
    return fp8::keeps_input_copy(attention->forward(x, {}));
  };
  EXPECT_TRUE(projection_keeps_copy({}, /*recast=*/false));
  EXPECT_FALSE(projection_keeps_copy({}, /*recast=*/true));
  EXPECT_TRUE(projection_keeps_copy({"--recompute-activations"}, /*recast=*/true));
  EXPECT_TRUE(projection_keeps_copy({"--attention-output-gate"}, /*recast=*/true));
}

TEST(Fp8Transposes, FlagIsCheckedAndNeedsFp8) {
  EXPECT_USER_ERROR(build(tiny_args({"--fp8-format", "hybrid", "--fp8-transposes", "drop"})), "fp8-transposes");
  EXPECT_TRUE(build(tiny_args({"--fp8-format", "hybrid", "--fp8-transposes", "recast"})).precision.fp8.enabled());
  EXPECT_FALSE(build(tiny_args({"--fp8-format", "hybrid", "--fp8-transposes", "recast"})).precision.fp8.keep_transposes);
  EXPECT_TRUE(build(tiny_args({"--fp8-format", "hybrid"})).precision.fp8.keep_transposes);
}

}  // namespace
}  // namespace fp8tron
