// Activation recomputation (models/recompute/recompute.h): every --recompute-* layout trains exactly as the
// run that keeps its activations (dropout on, so the replay must draw the same masks; dense and
// mixture-of-experts models), the
// replayed FP8 forward pass records no amax, and the flags Megatron refuses are refused by name.
#include <gtest/gtest.h>

#include <optional>

#include "fp8/forward_replay.h"
#include "fp8/fp8_linear.h"
#include "fp8/recipe.h"
#include "models/gpt_model.h"
#include "models/linear/linear_kernels_fp8.h"
#include "models/recompute/output_discarding_recompute.h"
#include "models/recompute/recompute.h"
#include "parallel/parallel_state.h"
#include "tests/identical_runs.h"
#include "tests/test_helpers.h"
#include "trainer/cli/model_math.h"
#include "trainer/trainer.h"

namespace fp8tron {
namespace {

using testing::build;
using testing::expect_identical;
using testing::tiny_args;
using testing::with;

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

// The runs compare bitwise (expect_identical): the replay is the same computation in the same
// order (each parameter's gradient comes from one recompute unit's backward), so not even the
// rounding may differ.
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

// Mixture of experts: the router's auxiliary losses, their logged values and the expert-bias token
// counts happen once, in the replay (Megatron's first pass runs under no_grad), and the replays
// run in the order of the forward passes, so the global-batch aux loss accumulated over the
// micro-batches sees the same counts. Input jitter draws from dropout's generator (replayed).
std::vector<std::string> moe_args() {
  return {"--num-experts", "4", "--moe-router-topk", "2", "--moe-ffn-hidden-size", "24", "--moe-layer-freq", "([0]+[1]*3)",
          "--moe-router-load-balancing-type", "aux_loss", "seq_aux_loss", "global_aux_loss", "--moe-aux-loss-coeff", "1e-2",
          "1e-2", "1e-2", "--moe-z-loss-coeff", "1e-3", "--moe-input-jitter-eps", "0.1", "--moe-router-enable-expert-bias",
          "--moe-router-bias-update-rate", "1e-2", "--moe-router-score-function", "sigmoid",
          "--moe-shared-expert-intermediate-size", "16", "--disable-bias-linear", "--global-batch-size", "8"};
}

TEST(Recompute, MixtureOfExpertsTrainsExactlyAsWithoutRecomputation) {
  const TrainResult plain = train_with(moe_args());
  const std::vector<std::vector<std::string>> layouts = {
      {"--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"},
      {"--recompute-granularity", "full", "--recompute-method", "block", "--recompute-num-layers", "3"},
      {"--recompute-granularity", "selective", "--recompute-modules", "moe"},
      {"--recompute-granularity", "selective", "--recompute-modules", "shared_experts"},
      {"--recompute-granularity", "selective", "--recompute-modules", "core_attn", "mlp", "moe", "shared_experts"},
      {"--moe-layer-recompute"},
      {"--moe-grouped-gemm", "--recompute-granularity", "selective", "--recompute-modules", "moe_act"},
      {"--recompute-granularity", "selective", "--recompute-modules", "layernorm"},
      {"--moe-grouped-gemm", "--recompute-granularity", "selective", "--recompute-modules", "layernorm", "moe_act", "moe",
       "shared_experts"},
  };
  for (const auto& layout : layouts) {
    std::string what;
    for (const auto& a : layout) what += a + " ";
    const TrainResult recomputed = train_with(with(moe_args(), layout));
    expect_identical(plain, recomputed, what);
    // The logged auxiliary losses too: counted once per micro-batch, with the same values.
    ASSERT_EQ(plain.moe_losses.size(), recomputed.moe_losses.size()) << what;
    ASSERT_EQ(plain.moe_losses.size(), 4u) << what;  // three balancing losses and z_loss
    for (const auto& [name, values] : plain.moe_losses) EXPECT_EQ(values, recomputed.moe_losses.at(name)) << what << name;
  }
}

// Multi-latent attention: core_attn (q, k, v kept), mla_up_proj (the up projections' outputs
// dropped and projected again), layernorm (its own input norm), with attention dropout replayed.
// (LayerNorm: on CPU, RMSNorm is a chain of ops whose two gradient paths into the norm's input are
// summed inside the replay before the residual's is added, a rounding-level difference of order,
// as in Megatron; LayerNorm's backward is one node, so the runs can be compared bit for bit.)
std::vector<std::string> mla_args() {
  return {"--multi-latent-attention", "--q-lora-rank", "12", "--kv-lora-rank", "10", "--qk-head-dim", "6",
          "--qk-pos-emb-head-dim", "4", "--v-head-dim", "8", "--qk-layernorm", "--position-embedding-type", "rope",
          "--swiglu", "--disable-bias-linear"};
}

TEST(Recompute, MultiLatentAttentionTrainsExactlyAsWithoutRecomputation) {
  const TrainResult plain = train_with(mla_args());
  const std::vector<std::vector<std::string>> layouts = {
      {"--recompute-activations"},
      {"--recompute-granularity", "selective", "--recompute-modules", "mla_up_proj"},
      {"--recompute-granularity", "selective", "--recompute-modules", "layernorm"},
      {"--recompute-granularity", "selective", "--recompute-modules", "layernorm", "mla_up_proj", "core_attn", "mlp"},
      {"--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "2"},
  };
  for (const auto& layout : layouts) {
    std::string what;
    for (const auto& a : layout) what += a + " ";
    expect_identical(plain, train_with(with(mla_args(), layout)), what);
  }
}

// The output-discarding checkpoint frees its outputs once the consumer has run (the consumer's
// saved copy included: they share memory), and puts them back before the consumer's backward.
TEST(OutputDiscardingRecompute, FreesTheOutputsAndRefillsThemBeforeTheConsumersBackward) {
  torch::manual_seed(3);
  const auto x = torch::randn({8, 16}, torch::requires_grad());
  const auto w = torch::randn({16, 16}, torch::requires_grad());
  auto fn = [](const torch::Tensor& t) { return torch::dropout(torch::tanh(t), 0.3, true); };
  // Reference: plain autograd.
  torch::manual_seed(5);
  auto ref_y = fn(x);
  auto ref_out = torch::mm(ref_y, w).sum();
  ref_out.backward();
  const auto ref_gx = x.grad().clone(), ref_gw = w.grad().clone();
  x.grad().zero_();
  w.grad().zero_();

  torch::manual_seed(5);
  OutputDiscardingRecompute checkpoint;
  auto y = checkpoint.run_one(fn, x);
  EXPECT_TRUE(torch::equal(y, ref_y));
  auto product = torch::mm(y, w);  // saves y for w's gradient
  checkpoint.discard(product);
  EXPECT_EQ(y.storage().nbytes(), 0u);  // freed: mm's saved copy shares this memory
  torch::manual_seed(11);                 // the replay draws the first pass's dropout mask anyway
  product.sum().backward();
  EXPECT_GT(y.storage().nbytes(), 0u);
  EXPECT_TRUE(torch::equal(x.grad(), ref_gx));
  EXPECT_TRUE(torch::equal(w.grad(), ref_gw));  // computed from the refilled y
}

TEST(Recompute, MixtureOfExpertsFp8TrainsExactlyAsWithoutRecomputation) {
  const std::vector<std::string> fp8 = {"--fp8-format", "hybrid", "--fp8-amax-history-len", "4"};
  const TrainResult plain = train_with(with(moe_args(), fp8));
  expect_identical(plain,
                   train_with(with(with(moe_args(), fp8), {"--recompute-granularity", "full", "--recompute-method",
                                                           "uniform", "--recompute-num-layers", "2"})),
                   "fp8 moe full uniform 2");
  expect_identical(plain, train_with(with(with(moe_args(), fp8), {"--recompute-granularity", "selective",
                                                                  "--recompute-modules", "moe"})),
                   "fp8 selective moe");
  // Megatron refuses moe_act and layernorm recomputation with delayed scaling; current scaling:
  const std::vector<std::string> tensorwise = {"--fp8-format", "hybrid", "--fp8-recipe", "tensorwise", "--moe-grouped-gemm"};
  expect_identical(train_with(with(moe_args(), tensorwise)),
                   train_with(with(with(moe_args(), tensorwise),
                                   {"--recompute-granularity", "selective", "--recompute-modules", "moe_act", "layernorm"})),
                   "fp8 tensorwise selective moe_act layernorm");
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
  EXPECT_USER_ERROR(build(tiny_args({"--num-experts", "4", "--moe-grouped-gemm", "--fp8-format", "hybrid",
                                     "--recompute-granularity", "selective", "--recompute-modules", "moe_act"})),
                    "not supported with --fp8-recipe delayed");
  EXPECT_USER_ERROR(build(tiny_args({"--num-experts", "4", "--recompute-granularity", "selective", "--recompute-modules",
                                     "moe_act"})),
                    "only supported with --moe-grouped-gemm");
  EXPECT_USER_ERROR(build(tiny_args({"--num-experts", "4", "--moe-shared-expert-intermediate-size", "16", "--disable-bias-linear",
                                     "--moe-shared-expert-overlap", "--moe-token-dispatcher-type", "alltoall",
                                     "--recompute-granularity", "selective", "--recompute-modules", "shared_experts"})),
                    "cannot work with --moe-shared-expert-overlap");
  EXPECT_USER_ERROR(build(tiny_args({"--num-experts", "4", "--moe-layer-recompute", "--recompute-granularity", "full",
                                     "--recompute-method", "uniform", "--recompute-num-layers", "1"})),
                    "--moe-layer-recompute");
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
