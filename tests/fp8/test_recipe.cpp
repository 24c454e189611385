// Recipes: validation rules (with the flag names in the message), per-tensor formats and scaling
// modes, fast accumulation, emulation notices, flag parsing.
#include <gtest/gtest.h>

#include <string>

#include "core/error.h"
#include "fp8/recipe.h"

namespace fp8tron::fp8 {
namespace {

std::string error_of(const Recipe& r) {
  try {
    validate(r);
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

TEST(Recipe, HiF8OnlyWithTensorwise) {
  EXPECT_EQ(error_of(CurrentScaling{Fp8Format::kHiF8}), "");
  DelayedScaling delayed;
  delayed.format = Fp8Format::kHiF8;
  const std::string e = error_of(delayed);
  EXPECT_TRUE(contains(e, "--fp8-format hif8")) << e;
  EXPECT_TRUE(contains(e, "--fp8-recipe tensorwise")) << e;
  EXPECT_TRUE(contains(e, "delayed")) << e;
  EXPECT_NE(error_of(BlockwiseScaling{Fp8Format::kHiF8}), "");
  EXPECT_NE(error_of(Mxfp8Scaling{Fp8Format::kHiF8}), "");
  EXPECT_THROW(make_recipe(RecipeKind::kDelayed, Fp8Format::kHiF8), UserError);
  EXPECT_NO_THROW(make_recipe(RecipeKind::kTensorwise, Fp8Format::kHiF8));
}

// Transformer Engine's Float8BlockScaling takes E4M3 or HYBRID (E5M2 for the backward tensors).
TEST(Recipe, BlockwiseIsE4M3OrHybrid) {
  EXPECT_EQ(error_of(BlockwiseScaling{Fp8Format::kE4M3}), "");
  EXPECT_EQ(error_of(BlockwiseScaling{Fp8Format::kHybrid}), "");
  const Recipe hybrid = BlockwiseScaling{Fp8Format::kHybrid};
  EXPECT_EQ(tensor_format(hybrid, TensorRole::kInput), Format::kE4M3);
  EXPECT_EQ(tensor_format(hybrid, TensorRole::kWeight), Format::kE4M3);
  EXPECT_EQ(tensor_format(hybrid, TensorRole::kGradOutput), Format::kE5M2);
  EXPECT_EQ(error_of(Mxfp8Scaling{Fp8Format::kHybrid}), "");
}

TEST(Recipe, DelayedScalingRanges) {
  DelayedScaling r;
  r.margin = -1;
  EXPECT_TRUE(contains(error_of(r), "--fp8-margin"));
  r = DelayedScaling{};
  r.interval = 0;
  EXPECT_TRUE(contains(error_of(r), "--fp8-interval"));
  r = DelayedScaling{};
  r.amax_history_len = 0;
  EXPECT_TRUE(contains(error_of(r), "--fp8-amax-history-len"));
  EXPECT_EQ(error_of(DelayedScaling{}), "");
}

TEST(Recipe, MegatronDefaults) {
  const DelayedScaling r;
  EXPECT_EQ(r.margin, 0);
  EXPECT_EQ(r.interval, 1);
  EXPECT_EQ(r.amax_history_len, 1);
  EXPECT_EQ(r.amax_compute_algo, AmaxComputeAlgo::kMostRecent);
}

TEST(Recipe, TensorFormats) {
  for (TensorRole role : {TensorRole::kInput, TensorRole::kWeight, TensorRole::kOutput}) {
    EXPECT_EQ(tensor_format(Fp8Format::kHybrid, role), Format::kE4M3);
    EXPECT_EQ(tensor_format(Fp8Format::kE4M3, role), Format::kE4M3);
    EXPECT_EQ(tensor_format(Fp8Format::kHiF8, role), Format::kHiF8);
  }
  for (TensorRole role : {TensorRole::kGradOutput, TensorRole::kGradInput}) {
    EXPECT_EQ(tensor_format(Fp8Format::kHybrid, role), Format::kE5M2);
    EXPECT_EQ(tensor_format(Fp8Format::kE4M3, role), Format::kE4M3);
    EXPECT_EQ(tensor_format(Fp8Format::kHiF8, role), Format::kHiF8);
  }
}

TEST(Recipe, ScalingModes) {
  const Recipe blockwise = BlockwiseScaling{};
  EXPECT_EQ(scaling_mode(blockwise, TensorRole::kWeight), ScalingMode::kBlock128x128);
  EXPECT_EQ(scaling_mode(blockwise, TensorRole::kInput), ScalingMode::kBlock1x128);
  EXPECT_EQ(scaling_mode(blockwise, TensorRole::kGradOutput), ScalingMode::kBlock1x128);
  EXPECT_EQ(scaling_mode(Recipe(DelayedScaling{}), TensorRole::kWeight), ScalingMode::kTensor);
  EXPECT_EQ(scaling_mode(Recipe(CurrentScaling{}), TensorRole::kInput), ScalingMode::kTensor);
  EXPECT_EQ(scaling_mode(Recipe(Mxfp8Scaling{}), TensorRole::kInput), ScalingMode::kMxfp8);
}

TEST(Recipe, FastAccumulationInFpropOnly) {
  for (const Recipe& r : {Recipe(DelayedScaling{}), Recipe(CurrentScaling{})}) {
    EXPECT_TRUE(use_fast_accumulation(r, GemmKind::kFprop));
    EXPECT_FALSE(use_fast_accumulation(r, GemmKind::kDgrad));
    EXPECT_FALSE(use_fast_accumulation(r, GemmKind::kWgrad));
  }
  EXPECT_FALSE(use_fast_accumulation(Recipe(BlockwiseScaling{}), GemmKind::kFprop));
}

TEST(Recipe, NativeOrEmulated) {
  EXPECT_TRUE(runs_natively(Recipe(DelayedScaling{}), 9));
  EXPECT_TRUE(runs_natively(Recipe(BlockwiseScaling{}), 9));
  EXPECT_FALSE(runs_natively(Recipe(Mxfp8Scaling{}), 9));
  EXPECT_TRUE(runs_natively(Recipe(Mxfp8Scaling{}), 10));
  EXPECT_FALSE(runs_natively(Recipe(CurrentScaling{Fp8Format::kHiF8}), 9));
  EXPECT_EQ(emulation_notice(Recipe(DelayedScaling{}), 9), "");
  EXPECT_TRUE(contains(emulation_notice(Recipe(Mxfp8Scaling{}), 9), "emulating"));
  EXPECT_TRUE(contains(emulation_notice(Recipe(CurrentScaling{Fp8Format::kHiF8}), 9), "HiF8"));
}

TEST(Recipe, GroupedTokenAlignmentIsMegatrons) {  // megatron/core/fp8_utils.py get_fp8_align_size
  EXPECT_EQ(fp8_token_alignment(Recipe(DelayedScaling{})), 16u);
  EXPECT_EQ(fp8_token_alignment(Recipe(CurrentScaling{})), 16u);
  EXPECT_EQ(fp8_token_alignment(Recipe(BlockwiseScaling{})), 16u);
  EXPECT_EQ(fp8_token_alignment(Recipe(Mxfp8Scaling{})), 32u);
}

TEST(Recipe, FlagParsing) {
  EXPECT_EQ(parse_recipe_kind("delayed"), RecipeKind::kDelayed);
  EXPECT_EQ(parse_recipe_kind("tensorwise"), RecipeKind::kTensorwise);
  EXPECT_EQ(parse_recipe_kind("blockwise"), RecipeKind::kBlockwise);
  EXPECT_EQ(parse_recipe_kind("mxfp8"), RecipeKind::kMxfp8);
  EXPECT_EQ(parse_fp8_format("hybrid"), Fp8Format::kHybrid);
  EXPECT_EQ(parse_amax_compute_algo("max"), AmaxComputeAlgo::kMax);
  try {
    parse_recipe_kind("delayd");
    FAIL();
  } catch (const UserError& e) {
    EXPECT_TRUE(contains(e.what(), "--fp8-recipe")) << e.what();
    EXPECT_TRUE(contains(e.what(), "did you mean 'delayed'")) << e.what();
  }
  EXPECT_THROW(parse_fp8_format("e5m2"), UserError);  // pure E5M2 training is not a recipe format
  EXPECT_THROW(parse_amax_compute_algo("mean"), UserError);
}

TEST(Recipe, MakeRecipeAndDescribe) {
  const Recipe r = make_recipe(RecipeKind::kDelayed, Fp8Format::kHybrid, 1, 2, 16, AmaxComputeAlgo::kMax);
  const auto& d = std::get<DelayedScaling>(r);
  EXPECT_EQ(d.margin, 1);
  EXPECT_EQ(d.interval, 2);
  EXPECT_EQ(d.amax_history_len, 16);
  EXPECT_EQ(d.amax_compute_algo, AmaxComputeAlgo::kMax);
  EXPECT_EQ(recipe_kind(r), RecipeKind::kDelayed);
  const std::string text = describe(r);
  EXPECT_TRUE(contains(text, "hybrid")) << text;
  EXPECT_TRUE(contains(text, "amax history 16 (max)")) << text;
  EXPECT_TRUE(contains(describe(Recipe(BlockwiseScaling{})), "128x128"));
}

}  // namespace
}  // namespace fp8tron::fp8
