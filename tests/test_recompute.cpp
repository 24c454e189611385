// Activation recomputation (models/recompute.h): every --recompute-* layout trains exactly as the
// run that keeps its activations (dropout on, so the replay must draw the same masks), the
// replayed FP8 forward pass records no amax, and the flags Megatron refuses are refused by name.
#include <gtest/gtest.h>

#include <optional>

#include "fp8/forward_replay.h"
#include "fp8/fp8_linear.h"
#include "fp8/recipe.h"
#include "models/gpt_model.h"
#include "models/linear_kernels_fp8.h"
#include "models/recompute.h"
#include "parallel/parallel_state.h"
#include "test_helpers.h"
#include "trainer/cli/model_math.h"
#include "trainer/trainer.h"

namespace fp8tron {
namespace {

using testing::build;
using testing::tiny_args;

std::vector<std::string> with(std::vector<std::string> base, const std::vector<std::string>& extra) {
  base.insert(base.end(), extra.begin(), extra.end());
  return base;
}

// Four layers with both dropouts on: a replay that drew other masks than the original pass would
// give other gradients.
std::vector<std::string> dropout_args() {
  return tiny_args({"--num-layers", "4", "--train-iters", "3", "--global-batch-size", "4", "--attention-dropout", "0.2",
                    "--hidden-dropout", "0.2", "--device", "cpu", "--eval-interval", "1000", "--log-interval", "1000"});
}

TrainResult train_with(const std::vector<std::string>& extra) {
  TrainOptions o;
  o.force_single_process = true;
  o.collect_final_weights = true;
  return train(build(with(dropout_args(), extra)), o);
}

// Bitwise: the replay is the same computation in the same order (each parameter's gradient comes
// from one recompute unit's backward), so not even the rounding may differ.
void expect_identical(const TrainResult& a, const TrainResult& b, const std::string& what) {
  ASSERT_EQ(a.losses.size(), b.losses.size()) << what;
  for (size_t i = 0; i < a.losses.size(); ++i) EXPECT_EQ(a.losses[i], b.losses[i]) << what << " iteration " << i + 1;
  ASSERT_EQ(a.final_weights.size(), b.final_weights.size()) << what;
  for (const auto& [name, w] : a.final_weights) EXPECT_TRUE(torch::equal(w, b.final_weights.at(name))) << what << ": " << name;
}

TEST(Recompute, EveryGranularityTrainsExactlyAsWithoutRecomputation) {
  const TrainResult plain = train_with({});
  const std::vector<std::vector<std::string>> layouts = {
      {"--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"},
      {"--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "3"},
      {"--recompute-granularity", "full", "--recompute-method", "block", "--recompute-num-layers", "2"},
      {"--recompute-activations"},
      {"--recompute-granularity", "selective", "--recompute-modules", "mlp"},
      {"--recompute-granularity", "selective", "--recompute-modules", "core_attn", "mlp"},
  };
  for (const auto& layout : layouts) {
    std::string what;
    for (const auto& a : layout) what += a + " ";
    expect_identical(plain, train_with(layout), what);
  }
}

// FP8 delayed scaling: the replay quantizes with the original pass's scales and records nothing,
// so the scales of every later step, and so the whole run, are the same as without recomputation.
TEST(Recompute, Fp8DelayedScalingTrainsExactlyAsWithoutRecomputation) {
  const std::vector<std::string> fp8 = {"--fp8-format", "hybrid", "--fp8-amax-history-len", "4"};
  const TrainResult plain = train_with(fp8);
  expect_identical(plain,
                   train_with(with(fp8, {"--recompute-granularity", "full", "--recompute-method", "uniform",
                                         "--recompute-num-layers", "2"})),
                   "fp8 full uniform 2");
  expect_identical(plain, train_with(with(fp8, {"--recompute-granularity", "selective", "--recompute-modules", "mlp"})),
                   "fp8 selective mlp");
}

TEST(Recompute, LayerUnitsFollowMegatronsMethods) {
  RecomputeConfig c;
  c.granularity = RecomputeGranularity::Full;
  c.method = RecomputeMethod::Uniform;
  c.num_layers = 2;
  auto u = layer_units(c, 5);  // 2 + 2 + 1, all recomputed
  ASSERT_EQ(u.size(), 3u);
  EXPECT_EQ(u[2].begin, 4);
  EXPECT_EQ(u[2].end, 5);
  for (const auto& x : u) EXPECT_TRUE(x.recomputed);
  c.method = RecomputeMethod::Block;
  u = layer_units(c, 5);  // layers 0 and 1 on their own, 2..4 kept
  ASSERT_EQ(u.size(), 3u);
  EXPECT_TRUE(u[0].recomputed && u[1].recomputed && u[0].end == 1);
  EXPECT_FALSE(u[2].recomputed);
  EXPECT_EQ(u[2].begin, 2);
  c.num_layers = 9;  // more than the chunk has: all of them
  u = layer_units(c, 3);
  ASSERT_EQ(u.size(), 3u);
  for (const auto& x : u) EXPECT_TRUE(x.recomputed);
}

// The replayed forward pass must not record the forward tensors' amaxes a second time. Recording
// max-accumulates, so a second recording of the same values would be invisible: the test clears
// the current amaxes between forward and backward; the backward pass may then record only the
// gradients' (kGradOutput) amaxes, never the inputs' or weights'.
TEST(Recompute, ReplayedFp8ForwardRecordsNoAmax) {
  for (const std::vector<std::string>& layout :
       {std::vector<std::string>{"--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "2"},
        std::vector<std::string>{"--recompute-granularity", "selective", "--recompute-modules", "mlp"}}) {
    const Config c = build(with(tiny_args({"--num-layers", "4", "--hidden-dropout", "0", "--attention-dropout", "0"}), layout));
    fp8::Fp8EngineOptions o;
    o.recipe = fp8::make_recipe(fp8::RecipeKind::kDelayed, fp8::Fp8Format::kHybrid);
    o.num_layers = c.model.num_layers;
    auto engine = std::make_shared<fp8::Fp8Engine>(o, torch::Device(torch::kCPU));
    TensorParallelContext tp;
    tp.comm = make_self_communicator("tp", 0);
    GptModel model(c.model, tp, StageSpec::whole(c.model), engine);
    model->train();
    torch::manual_seed(3);
    auto tokens = torch::randint(0, 64, {2, 16}, torch::kInt64);
    auto loss = model->loss(tokens, tokens.roll(-1, 1), torch::ones({2, 16}));
    auto& history = engine->history();
    ASSERT_GT(engine->num_sites(), 0u);
    for (const auto& site : engine->sites())
      ASSERT_GT(history[0][int64_t(engine->slot(*site, fp8::TensorRole::kInput))].item<float>(), 0.0f) << site->name;
    history[0].zero_();
    loss.backward();
    for (const auto& site : engine->sites()) {
      EXPECT_EQ(history[0][int64_t(engine->slot(*site, fp8::TensorRole::kInput))].item<float>(), 0.0f) << site->name;
      EXPECT_EQ(history[0][int64_t(engine->slot(*site, fp8::TensorRole::kWeight))].item<float>(), 0.0f) << site->name;
      EXPECT_GT(history[0][int64_t(engine->slot(*site, fp8::TensorRole::kGradOutput))].item<float>(), 0.0f) << site->name;
    }
    for (const auto& p : model->parameters()) EXPECT_TRUE(p.grad().defined());
  }
}

// The same for the overlapped tensor-parallel linears' FP8 kernels (--tp-comm-overlap): their
// input casts (the gathered rows and a row-parallel input) and the FP8 reduce-scatter's partials
// record amaxes in a training step, and none in a replay. The replay runs first, so that no FP8
// weight is cached yet.
TEST(Recompute, ReplayedOverlappedFp8KernelsRecordNoAmax) {
  fp8::Fp8EngineOptions o;
  o.recipe = fp8::make_recipe(fp8::RecipeKind::kDelayed, fp8::Fp8Format::kHybrid);
  o.num_layers = 1;
  auto engine = std::make_shared<fp8::Fp8Engine>(o, torch::Device(torch::kCPU));
  auto site = engine->add_site("decoder.layers.0.mlp.linear_fc1", 0, 32, 32);
  ASSERT_NE(site, nullptr);
  auto tp = make_self_communicator("tp", 0);
  torch::manual_seed(5);
  const auto weight = torch::randn({32, 32}).requires_grad_(true);
  const auto x = torch::randn({16, 32});
  auto& history = engine->history();
  const auto recorded = [&](fp8::TensorRole role) {
    return history[0][int64_t(engine->slot(*site, role))].item<float>();
  };
  for (const bool replay : {true, false}) {
    history.zero_();
    std::optional<fp8::ForwardReplayGuard> guard;
    if (replay) guard.emplace();
    Fp8LinearKernels kernels(weight, {}, *site, *tp, overlap::TpLinearPlan{}, fp8::Prologue::kNone);
    kernels.prepare_input(x, /*to_gather=*/true);
    kernels.prepare_input(x, /*to_gather=*/false);
    kernels.quantize_partial(x);
    for (auto role : {fp8::TensorRole::kInput, fp8::TensorRole::kOutput}) {
      if (replay) EXPECT_EQ(recorded(role), 0.0f) << "replay, role " << int(role);
      else EXPECT_GT(recorded(role), 0.0f) << "training step, role " << int(role);
    }
  }
}

TEST(Recompute, RefusesWhatMegatronRefusesByName) {
  EXPECT_USER_ERROR(build(tiny_args({"--recompute-granularity", "full", "--recompute-num-layers", "1"})),
                    "--recompute-method");
  EXPECT_USER_ERROR(build(tiny_args({"--recompute-granularity", "full", "--recompute-method", "block"})),
                    "--recompute-num-layers");
  EXPECT_USER_ERROR(build(tiny_args({"--recompute-granularity", "selective", "--recompute-method", "uniform"})),
                    "--recompute-method");
  EXPECT_USER_ERROR(build(tiny_args({"--recompute-granularity", "sometimes"})), "--recompute-granularity");
  EXPECT_USER_ERROR(build(tiny_args({"--recompute-granularity", "selective", "--recompute-modules", "attn"})),
                    "--recompute-modules attn");
  EXPECT_USER_ERROR(build(tiny_args({"--recompute-granularity", "selective", "--recompute-modules", "mla_up_proj"})),
                    "--recompute-modules mla_up_proj");
  EXPECT_USER_ERROR(build(tiny_args({"--recompute-granularity", "selective", "--recompute-modules", "moe"})),
                    "--recompute-modules moe");
  EXPECT_USER_ERROR(build(tiny_args({"--num-experts", "4", "--recompute-granularity", "full", "--recompute-method",
                                     "uniform", "--recompute-num-layers", "1"})),
                    "with --num-experts is not implemented");
  // A per-layer --cp-comm-type list gives the MTP layers the types of the first layers (Megatron).
  EXPECT_USER_ERROR(build(tiny_args({"--context-parallel-size", "2", "--num-layers", "2", "--cp-comm-type", "p2p", "a2a",
                                     "--mtp-num-layers", "3", "--position-embedding-type", "rope"}),
                          2),
                    "--mtp-num-layers");
  EXPECT_USER_ERROR(build(tiny_args({"--context-parallel-size", "2", "--reset-attention-mask"}), 2),
                    "--reset-attention-mask");
  EXPECT_USER_ERROR(build(tiny_args({"--context-parallel-size", "2", "--seq-length", "18"}), 2), "--seq-length");
  EXPECT_USER_ERROR(build(tiny_args({"--distribute-saved-activations", "--recompute-granularity", "full",
                                     "--recompute-method", "uniform", "--recompute-num-layers", "1"})),
                    "--distribute-saved-activations");
}

// Context parallelism composes with mixture of experts (also with expert parallelism over the
// context-parallel ranks), multi-latent attention, multi-token prediction and the per-token loss
// (the parallel.cp2_* equivalence tests train them).
TEST(Recompute, ContextParallelismTakesExpertsLatentAttentionMtpAndPerTokenLoss) {
  const std::vector<std::vector<std::string>> combos = {
      {"--num-experts", "4", "--expert-model-parallel-size", "2"},
      {"--multi-latent-attention", "--kv-lora-rank", "16", "--qk-head-dim", "8", "--qk-pos-emb-head-dim", "8",
       "--v-head-dim", "4"},
      {"--mtp-num-layers", "2", "--position-embedding-type", "rope"},
      {"--calculate-per-token-loss"}};
  for (const auto& combo : combos) {
    const Config c = build(with(tiny_args({"--context-parallel-size", "2"}), combo), 2);
    EXPECT_EQ(c.parallel.cp, 2);
  }
}

// The dry run's memory estimate: full recomputation keeps one 16-bit input per unit plus one
// unit's activations; selective core_attn drops the paper formula's attention scores; context
// parallelism halves every rank's tokens.
TEST(Recompute, DryRunEstimateFollowsRecomputationAndContextParallelism) {
  auto big = [](std::initializer_list<std::string> extra) {
    auto a = tiny_args({"--num-layers", "8", "--hidden-size", "256", "--seq-length", "256"});
    a.insert(a.end(), extra.begin(), extra.end());
    return estimate_memory(build(a, 2));
  };
  const MemoryEstimate none = big({}), full = big({"--recompute-granularity", "full", "--recompute-method", "uniform",
                                                   "--recompute-num-layers", "1"});
  const double s = 256, b = 2, h = 256, per_layer = s * b * h * 34;
  EXPECT_DOUBLE_EQ(none.activations_fused - 8 * 4.0 * 4 * s * b, 8 * per_layer);
  EXPECT_DOUBLE_EQ(full.activations_fused - 4.0 * 4 * s * b, 8 * 2 * s * b * h + per_layer);
  const MemoryEstimate block = big({"--recompute-granularity", "full", "--recompute-method", "block", "--recompute-num-layers", "4"});
  EXPECT_DOUBLE_EQ(block.activations_fused - 5 * 4.0 * 4 * s * b, 4 * per_layer + 4 * 2 * s * b * h + per_layer);
  EXPECT_LT(big({"--recompute-activations"}).activations_paper, none.activations_paper);
  EXPECT_DOUBLE_EQ(big({"--context-parallel-size", "2"}).activations_fused, none.activations_fused / 2);
}

TEST(Recompute, ActivationsFlagMeansSelectiveCoreAttention) {
  const Config c = build(tiny_args({"--recompute-activations"}));
  EXPECT_EQ(c.model.recompute.granularity, RecomputeGranularity::Selective);
  EXPECT_TRUE(c.model.recompute.selective(&RecomputeModules::core_attn));
  EXPECT_FALSE(c.model.recompute.selective(&RecomputeModules::mlp));
}

}  // namespace
}  // namespace fp8tron
