// The MoE model on the CPU: Megatron's parameter names, experts named and drawn by their global
// index (independent of the expert-parallel layout), FP8 expert padding that changes nothing, the
// two dispatchers agreeing, and MoE training end to end (bf16-free fp32, and FP8 emulated).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <set>

#include "core/deferred_work.h"
#include "fp8/fp8_linear.h"
#include "models/gpt_model.h"
#include "models/moe/experts.h"
#include "models/moe/moe_layer.h"
#include "parallel/parallel_state.h"
#include "tests/test_helpers.h"
#include "checkpoint/file_io.h"
#include "trainer/cli/model_math.h"
#include "trainer/logging/tensorboard_writer.h"
#include "trainer/trainer.h"

#include <dirent.h>

namespace fp8tron {
namespace {
using namespace fp8tron::testing;

std::vector<std::string> moe_args(std::initializer_list<std::string> extra = {}) {
  auto a = tiny_args({"--attention-dropout", "0", "--hidden-dropout", "0", "--num-experts", "4", "--moe-ffn-hidden-size",
                      "32", "--moe-layer-freq", "([0]+[1])"});
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

// A group that only reports a size and rank: enough to build an expert-parallel rank's modules.
class ShapeOnlyGroup : public Communicator {
 public:
  ShapeOnlyGroup(int rank, int size) : Communicator("shape-only", rank, size, {}) {}
  std::unique_ptr<CommWork> all_reduce_async(torch::Tensor&, ReduceOp) override { return fail(); }
  std::unique_ptr<CommWork> all_gather_async(torch::Tensor&, const torch::Tensor&) override { return fail(); }
  std::unique_ptr<CommWork> reduce_scatter_async(torch::Tensor&, const torch::Tensor&) override { return fail(); }
  std::unique_ptr<CommWork> reduce_scatter_v_async(torch::Tensor&, const torch::Tensor&, const std::vector<int64_t>&) override {
    return fail();
  }
  std::unique_ptr<CommWork> all_gather_v_async(torch::Tensor&, const torch::Tensor&, const std::vector<int64_t>&) override {
    return fail();
  }
  std::unique_ptr<CommWork> all_to_all_v_async(torch::Tensor&, const torch::Tensor&, const std::vector<int64_t>&,
                                               const std::vector<int64_t>&) override {
    return fail();
  }
  void broadcast(torch::Tensor&, int) override { fail(); }
  std::unique_ptr<CommWork> batch_p2p_async(std::vector<P2POp>) override { return fail(); }
  void barrier() override { fail(); }

 private:
  static std::unique_ptr<CommWork> fail() { throw std::runtime_error("ShapeOnlyGroup cannot communicate"); }
};

TensorParallelContext no_tp() { return TensorParallelContext{make_self_communicator("tp", 0), 0, 1, false}; }

TEST(MoeModel, MegatronNamesWithADenseFirstLayer) {
  const ModelConfig m = build(moe_args({"--swiglu", "--disable-bias-linear", "--moe-shared-expert-intermediate-size", "16",
                                        "--moe-shared-expert-gate", "--moe-router-score-function", "sigmoid",
                                        "--moe-router-enable-expert-bias"}))
                            .model;
  GptModel model(m);
  std::set<std::string> names;
  for (const auto& p : model->named_parameters()) names.insert(p.key());
  for (const char* n : {"decoder.layers.0.mlp.linear_fc1.layer_norm_weight", "decoder.layers.0.mlp.linear_fc1.weight",
                        "decoder.layers.1.pre_mlp_layernorm.weight", "decoder.layers.1.mlp.router.weight",
                        "decoder.layers.1.mlp.experts.linear_fc1.weight0", "decoder.layers.1.mlp.experts.linear_fc1.weight3",
                        "decoder.layers.1.mlp.experts.linear_fc2.weight2", "decoder.layers.1.mlp.shared_experts.linear_fc1.weight",
                        "decoder.layers.1.mlp.shared_experts.linear_fc2.weight", "decoder.layers.1.mlp.shared_experts.gate_weight"})
    EXPECT_TRUE(names.count(n)) << n;
  EXPECT_FALSE(names.count("decoder.layers.1.mlp.linear_fc1.weight"));
  std::vector<std::string> buffers;
  for (const auto& b : model->named_buffers()) buffers.push_back(b.key());
  EXPECT_EQ(buffers, (std::vector<std::string>{"decoder.layers.1.mlp.router.expert_bias"}));
  // Shapes: fc1 [2 x ffn, h] per expert (SwiGLU), router [E, h], gate [1, h].
  const auto params = model->named_parameters();
  EXPECT_EQ(params["decoder.layers.1.mlp.experts.linear_fc1.weight1"].sizes(), (std::vector<int64_t>{64, 32}));
  EXPECT_EQ(params["decoder.layers.1.mlp.experts.linear_fc2.weight1"].sizes(), (std::vector<int64_t>{32, 32}));
  EXPECT_EQ(params["decoder.layers.1.mlp.router.weight"].sizes(), (std::vector<int64_t>{4, 32}));
  EXPECT_EQ(params["decoder.layers.1.mlp.shared_experts.gate_weight"].sizes(), (std::vector<int64_t>{1, 32}));
  // Expert parameters are marked for the expert domain; the router and shared experts are dense.
  const auto infos = model->param_infos();
  EXPECT_TRUE(infos.at("decoder.layers.1.mlp.experts.linear_fc1.weight0").expert);
  EXPECT_FALSE(infos.at("decoder.layers.1.mlp.router.weight").expert);
  EXPECT_FALSE(infos.at("decoder.layers.1.mlp.shared_experts.linear_fc1.weight").expert);
  // The closed form counts every parameter (the expert-bias buffer is not one).
  int64_t n = 0;
  for (const auto& p : model->parameters()) n += p.numel();
  EXPECT_EQ(count_parameters(m).total, n);
}

TEST(MoeModel, ExpertsAreNamedAndDrawnByTheirGlobalIndex) {
  const ModelConfig m = build(moe_args()).model;
  GptModel whole(m);
  // Expert-parallel rank 1 of 2 holds experts 2 and 3.
  ExpertParallelGroups g = ExpertParallelGroups::single_process();
  g.ep = std::make_shared<ShapeOnlyGroup>(1, 2);
  g.ep_rank = 1;
  auto context = std::make_shared<MoeContext>(m.moe, m.num_layers, g);
  GptModel second(m, no_tp(), StageSpec::whole(m), nullptr, context);
  const auto all = whole->named_parameters();
  int experts = 0;
  for (const auto& p : second->named_parameters()) {
    if (p.key().find(".experts.") == std::string::npos) continue;
    ++experts;
    EXPECT_TRUE(p.key().find("weight2") != std::string::npos || p.key().find("weight3") != std::string::npos ||
                p.key().find("bias2") != std::string::npos || p.key().find("bias3") != std::string::npos)
        << p.key();
    EXPECT_TRUE(torch::equal(p.value(), all[p.key()])) << p.key();
  }
  EXPECT_EQ(experts, 8);  // fc1 and fc2, weight and bias, two experts
}

std::shared_ptr<fp8::Fp8Engine> cpu_engine(fp8::RecipeKind kind) {
  fp8::Fp8EngineOptions o;
  o.recipe = fp8::make_recipe(kind, fp8::Fp8Format::kHybrid);
  o.num_layers = 4;
  return std::make_shared<fp8::Fp8Engine>(o, torch::Device(torch::kCPU));
}

// FP8 experts pad each expert's rows to a multiple of 16 with zero rows (inside TEGroupedLinear): the
// output rows do not depend on the padding (current scaling: a zero row changes no amax; each
// output row depends on its own input row only), so they equal per-expert FP8 linears on the
// expert's rows padded differently (to 48).
TEST(MoeModel, Fp8ExpertPaddingChangesNoOutput) {
  const ModelConfig m = build(moe_args({"--disable-bias-linear"})).model;
  auto engine = cpu_engine(fp8::RecipeKind::kTensorwise);
  GroupedMlp experts(m, "decoder.layers.1.mlp.experts", 4, 0, ModuleFactory(m.seed, no_tp(), engine), true);
  ASSERT_EQ(engine->num_sites(), 8u);
  const std::vector<int64_t> counts = {5, 0, 11, 8};
  torch::manual_seed(4);
  auto x = torch::randn({24, m.hidden_size});
  auto y = experts(x, counts);
  ASSERT_EQ(y.sizes(), (std::vector<int64_t>{24, m.hidden_size}));
  int64_t row = 0;
  for (size_t e = 0; e < counts.size(); ++e) {
    if (counts[e] == 0) continue;
    auto xe = torch::zeros({48, m.hidden_size});
    xe.narrow(0, 0, counts[e]).copy_(x.narrow(0, row, counts[e]));
    auto h = fp8::fp8_linear(xe, experts->linear_fc1->weights[e], {}, *experts->linear_fc1->fp8_sites[e]);
    auto ye = fp8::fp8_linear(at::gelu(h, "tanh"), experts->linear_fc2->weights[e], {}, *experts->linear_fc2->fp8_sites[e]);
    // Same quantized operands; only the GEMM's row blocking differs.
    EXPECT_TRUE(torch::allclose(y.narrow(0, row, counts[e]), ye.narrow(0, 0, counts[e]), 1e-6, 1e-6)) << "expert " << e;
    // And it is FP8: not the exact product.
    auto exact = torch::mm(at::gelu(torch::mm(x.narrow(0, row, counts[e]), experts->linear_fc1->weights[e].t()), "tanh"),
                           experts->linear_fc2->weights[e].t());
    EXPECT_FALSE(torch::allclose(y.narrow(0, row, counts[e]), exact, 1e-4, 1e-5));
    row += counts[e];
  }
}

torch::Tensor layer_input(const ModelConfig& m, uint64_t seed) {
  torch::manual_seed(seed);
  return torch::randn({m.seq_length, 2, m.hidden_size});
}

TEST(MoeModel, AllGatherAndAllToAllDispatchersAgreeInOneProcess) {
  for (auto extra : {std::vector<std::string>{}, std::vector<std::string>{"--moe-expert-capacity-factor", "0.5"}}) {
    auto args_ag = moe_args(), args_a2a = moe_args({"--moe-token-dispatcher-type", "alltoall"});
    args_ag.insert(args_ag.end(), extra.begin(), extra.end());
    args_a2a.insert(args_a2a.end(), extra.begin(), extra.end());
    std::vector<torch::Tensor> outputs, grads;
    for (const auto& args : {args_ag, args_a2a}) {
      const ModelConfig m = build(args).model;
      auto context = std::make_shared<MoeContext>(m.moe, m.num_layers, ExpertParallelGroups::single_process());
      MoeLayer layer(m, "decoder.layers.1.mlp", 1, ModuleFactory(m.seed, no_tp()), context);
      layer->train();
      auto x = layer_input(m, 5).requires_grad_(true);
      auto y = layer(x);
      y.pow(2).sum().backward();
      outputs.push_back(y.detach());
      grads.push_back(x.grad());
    }
    EXPECT_TRUE(torch::equal(outputs[0], outputs[1]));
    EXPECT_TRUE(torch::equal(grads[0], grads[1]));
  }
}

Config train_config(std::initializer_list<std::string> extra) {
  auto args = moe_args({"--global-batch-size", "4", "--train-iters", "12", "--lr", "3e-3", "--log-interval", "100",
                        "--eval-iters", "0", "--device", "cpu", "--num-layers", "2"});
  args.insert(args.end(), extra.begin(), extra.end());
  return build(args);
}

bool learns(const std::vector<double>& losses) {
  for (double l : losses)
    if (!std::isfinite(l)) return false;
  return losses.back() < losses.front();
}

TEST(MoeTraining, TrainsWithEachDispatcherAndFeature) {
  for (auto extra : {std::initializer_list<std::string>{"--moe-aux-loss-coeff", "1e-2"},
                     {"--moe-token-dispatcher-type", "alltoall", "--moe-z-loss-coeff", "1e-3", "--moe-aux-loss-coeff", "1e-2"},
                     {"--moe-router-score-function", "sigmoid", "--moe-router-enable-expert-bias", "--moe-router-topk", "1",
                      "--moe-router-load-balancing-type", "seq_aux_loss", "--moe-aux-loss-coeff", "1e-2"},
                     {"--moe-router-load-balancing-type", "sinkhorn"},
                     {"--moe-expert-capacity-factor", "1.0", "--moe-pad-expert-input-to-capacity"},
                     {"--moe-router-load-balancing-type", "global_aux_loss", "--moe-aux-loss-coeff", "1e-2",
                      "--moe-input-jitter-eps", "0.01"}}) {
    const Config c = train_config(extra);
    const TrainResult r = train(c);
    EXPECT_TRUE(learns(r.losses)) << r.losses.front() << " -> " << r.losses.back();
  }
}

// FP8 on the CPU runs the emulated path; unaligned expert counts are padded by the experts (the
// allgather dispatcher), or in the routing map (alltoall with --moe-router-padding-for-fp8).
TEST(MoeTraining, Fp8TrainsEmulatedOnTheCpu) {
  for (auto extra : {std::initializer_list<std::string>{"--fp8-format", "hybrid"},
                     {"--fp8-format", "hybrid", "--fp8-recipe", "tensorwise"},
                     {"--fp8-format", "e4m3", "--fp8-recipe", "blockwise"},
                     {"--fp8-format", "hybrid", "--moe-token-dispatcher-type", "alltoall", "--moe-router-padding-for-fp8",
                      "--seq-length", "64"},
                     {"--fp8-format", "hybrid", "--no-use-gmm-fp8"}}) {
    const Config c = train_config(extra);
    const TrainResult r = train(c);
    EXPECT_TRUE(learns(r.losses)) << r.losses.front() << " -> " << r.losses.back();
  }
}

// Megatron's names every iteration in TensorBoard, per layer with --moe-per-layer-logging, and the
// same values in the run's result (what the iteration line averages).
TEST(MoeTraining, TensorBoardHasTheMoeLossesPerIterationAndPerLayer) {
  const std::string dir = temp_file("moe_tb", "");
  std::remove(dir.c_str());
  const Config c = train_config({"--moe-aux-loss-coeff", "1e-2", "--moe-z-loss-coeff", "1e-3", "--moe-per-layer-logging",
                                 "--tensorboard-dir", dir, "--tensorboard-log-interval", "5"});
  const TrainResult r = train(c);
  std::string file;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d))
      if (std::string(e->d_name).rfind("events.out.tfevents", 0) == 0) file = dir + "/" + e->d_name;
    closedir(d);
  }
  ASSERT_FALSE(file.empty());
  std::map<std::string, std::vector<double>> by_tag;
  for (const auto& ev : read_tensorboard_scalars(file)) by_tag[ev.tag].push_back(ev.value);
  ASSERT_EQ(by_tag["load_balancing_loss"].size(), 12u);  // every iteration, not every 5th
  ASSERT_EQ(by_tag["z_loss"].size(), 12u);
  for (size_t i = 0; i < 12; ++i) {
    EXPECT_NEAR(by_tag["load_balancing_loss"][i], r.moe_losses.at("load_balancing_loss")[i], 1e-6);
    EXPECT_NEAR(by_tag["z_loss"][i], r.moe_losses.at("z_loss")[i], 1e-5);
  }
  // Layer 0 is dense (zeros); with one MoE layer of two, its value is the mean over MoE layers.
  ASSERT_EQ(by_tag["moe/load_balancing_loss_layer_1"].size(), 12u);
  EXPECT_EQ(by_tag["moe/load_balancing_loss_layer_0"][3], 0.0);
  EXPECT_NEAR(by_tag["moe/load_balancing_loss_layer_1"][3], by_tag["load_balancing_loss"][3], 1e-6);
  // The aux loss at near-uniform routing of a fresh model is close to 1.
  EXPECT_NEAR(r.moe_losses.at("load_balancing_loss")[0], 1.0, 0.1);
  checkpoint::remove_tree(dir);
}


// --delay-wgrad-compute: every linear of the transformer layers (attention, the dense MLP, the
// routed experts' grouped GEMMs, the shared expert; fp32 on the CPU) leaves its weight gradient
// to the queue; the router, norms, embedding and output layer do not wait. After the queue ran,
// every gradient equals bitwise the run without it, micro-batch by micro-batch. (FP8: the layout
// test parallel.moe_ep2_fp8_a2a_overlap_delay_wgrad.)
TEST(MoeModel, HeldWeightGradientsEqualTheImmediateOnes) {
  const ModelConfig m =
      build(moe_args({"--moe-shared-expert-intermediate-size", "32", "--swiglu", "--disable-bias-linear"})).model;
  for (const bool fp8 : {false}) {
    auto make = [&](MainGradsPtr grads) {
      auto context = std::make_shared<MoeContext>(m.moe, m.num_layers, ExpertParallelGroups::single_process());
      return GptModel(m, no_tp(), StageSpec::whole(m), fp8 ? cpu_engine(fp8::RecipeKind::kTensorwise) : nullptr, context,
                      ContextParallelContext{}, std::move(grads));
    };
    auto queue = std::make_shared<DeferredWork>();
    auto held_grads = make_main_grads();
    held_grads->set_wgrad_queue(queue);
    GptModel plain = make(make_main_grads()), held = make(held_grads);
    const auto delayed = held_grads->delayed_params();
    std::set<const void*> delayed_keys;
    for (const auto& p : delayed) delayed_keys.insert(p.unsafeGetTensorImpl());
    std::set<std::string> delayed_names;
    for (const auto& p : held->named_parameters())
      if (delayed_keys.count(p.value().unsafeGetTensorImpl())) delayed_names.insert(p.key());
    // attention qkv and proj, the dense MLP of layer 0, 4 experts x 2 and the shared expert's 2 in layer 1.
    EXPECT_EQ(delayed_names.size(), 2u * 2 + 2 + 8 + 2) << "fp8 " << fp8;
    EXPECT_TRUE(delayed_names.count("decoder.layers.0.self_attention.linear_qkv.weight"));
    EXPECT_TRUE(delayed_names.count("decoder.layers.1.mlp.experts.linear_fc2.weight3"));
    EXPECT_TRUE(delayed_names.count("decoder.layers.1.mlp.shared_experts.linear_fc1.weight"));
    EXPECT_FALSE(delayed_names.count("output_layer.weight") || delayed_names.count("decoder.layers.1.mlp.router.weight"));
    plain->train();
    held->train();
    torch::manual_seed(9);
    for (int mb = 0; mb < 2; ++mb) {
      const auto tokens = torch::randint(0, 64, {2, 16}, torch::kInt64);
      for (auto* model : {&plain, &held}) (*model)->loss(tokens, tokens.roll(-1, 1), torch::ones({2, 16})).backward();
      EXPECT_EQ(queue->held(), (mb + 1) * int64_t(1 + 1 + 2 + 2 + 2 + 2)) << "one closure per linear, one per grouped GEMM";
      for (const auto& p : held->named_parameters()) {
        const auto& g = p.value().grad();
        const auto& ref = plain->named_parameters()[p.key()].grad();
        if (delayed_names.count(p.key())) {
          if (mb == 0) EXPECT_FALSE(g.defined()) << p.key() << " before the queue ran";
        } else {
          EXPECT_TRUE(g.defined() && torch::equal(g, ref)) << p.key() << " fp8 " << fp8;
        }
      }
      EXPECT_EQ(queue->run(), 1 + 1 + 2 + 2 + 2 + 2);
      for (const auto& p : held->named_parameters())
        EXPECT_TRUE(torch::equal(p.value().grad(), plain->named_parameters()[p.key()].grad())) << p.key() << " fp8 " << fp8;
    }
  }
}

}  // namespace
}  // namespace fp8tron
