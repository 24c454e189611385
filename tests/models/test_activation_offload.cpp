// Fine-grained activation offloading (models/recompute/activation_offload.h): with every module of
// --offload-modules offloaded the model trains exactly as without (the reloaded bytes are the
// saved ones; dense, mixture-of-experts and multi-latent attention models, with selective
// recomputation and FP8), each named module really moved bytes to host memory and released its
// device copy, and the combinations Megatron refuses are refused by name.
#include <gtest/gtest.h>

#include <algorithm>

#include "models/gpt_model.h"
#include "models/recompute/activation_offload.h"
#include "tests/identical_runs.h"
#include "tests/test_helpers.h"
#include "trainer/trainer.h"

namespace fp8tron {
namespace {

using testing::build;
using testing::expect_identical;
using testing::tiny_args;
using testing::with;

const std::vector<std::string> kAttention = {"attn_norm", "qkv_linear", "core_attn", "attn_proj", "mlp_norm"};

std::vector<std::string> offload(const std::vector<std::string>& modules) {
  std::vector<std::string> a = {"--fine-grained-activation-offloading", "--min-offloaded-tensor-size", "0",
                                "--offload-modules"};
  a.insert(a.end(), modules.begin(), modules.end());
  return a;
}

std::vector<std::string> base_args() {
  return tiny_args({"--num-layers", "3", "--train-iters", "3", "--global-batch-size", "4", "--attention-dropout", "0.2",
                    "--hidden-dropout", "0.2", "--device", "cpu", "--eval-interval", "1000", "--log-interval", "1000"});
}

std::vector<std::string> moe_args() {
  return {"--num-experts", "4", "--moe-router-topk", "2", "--moe-ffn-hidden-size", "24", "--moe-layer-freq", "([0]+[1]*2)",
          "--moe-aux-loss-coeff", "1e-2", "--moe-grouped-gemm", "--swiglu", "--disable-bias-linear",
          "--moe-shared-expert-intermediate-size", "16"};
}

std::vector<std::string> mla_args() {
  return {"--multi-latent-attention", "--q-lora-rank", "12", "--kv-lora-rank", "10", "--qk-head-dim", "6",
          "--qk-pos-emb-head-dim", "4", "--v-head-dim", "8", "--qk-layernorm", "--position-embedding-type", "rope",
          "--swiglu", "--disable-bias-linear"};
}

TrainResult train_with(const std::vector<std::string>& extra) {
  TrainOptions o;
  o.force_single_process = true;
  o.collect_final_weights = true;
  return train(build(with(base_args(), extra)), o);
}

std::string describe(const std::vector<std::string>& args) {
  std::string s;
  for (const auto& a : args) s += a + " ";
  return s;
}

void expect_same_training(const std::vector<std::string>& model, const std::vector<std::vector<std::string>>& layouts) {
  for (const auto& layout : layouts) {
    const TrainResult plain = train_with(with(model, layout));
    const auto all = with(with(model, layout), offload(with(kAttention, {"expert_fc1", "moe_act"})));
    const TrainResult offloaded = train_with(all);
    expect_identical(plain, offloaded, describe(all));
    EXPECT_TRUE(plain.activation_offload_bytes.empty());
    // It did offload; layers recomputed whole keep nothing but their input (nothing to offload).
    const bool full = std::find(layout.begin(), layout.end(), "full") != layout.end();
    EXPECT_EQ(offloaded.activation_offload_bytes.empty(), full) << describe(all);
  }
}

TEST(ActivationOffload, DenseModelTrainsExactlyAsWithoutOffloading) {
  expect_same_training({}, {{},
                            {"--recompute-granularity", "selective", "--recompute-modules", "core_attn"},
                            {"--recompute-granularity", "selective", "--recompute-modules", "mlp"},
                            {"--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"},
                            {"--attention-output-gate", "--group-query-attention", "--num-query-groups", "2"}});
}

TEST(ActivationOffload, MixtureOfExpertsTrainsExactlyAsWithoutOffloading) {
  expect_same_training(moe_args(), {{},
                                    {"--recompute-granularity", "selective", "--recompute-modules", "moe_act", "layernorm"},
                                    {"--recompute-granularity", "selective", "--recompute-modules", "core_attn", "mlp"}});
}

TEST(ActivationOffload, MultiLatentAttentionTrainsExactlyAsWithoutOffloading) {
  expect_same_training(mla_args(), {{},
                                    {"--recompute-granularity", "selective", "--recompute-modules", "layernorm",
                                     "mla_up_proj", "core_attn"}});
}

TEST(ActivationOffload, Fp8TrainsExactlyAsWithoutOffloading) {
  const std::vector<std::string> fp8 = {"--fp8-format", "hybrid", "--fp8-recipe", "tensorwise"};
  expect_same_training(with(moe_args(), fp8), {{}});
}

// One forward and backward pass of the whole model: the offloaded bytes per module, and the
// gradients against a model without offloading (the same seed draws the same weights).
struct Pass {
  std::map<std::string, int64_t> bytes;
  std::map<std::string, torch::Tensor> grads;
  torch::Tensor loss;
};

Pass one_pass(const std::vector<std::string>& args) {
  const Config c = build(with(base_args(), args));
  GptModel model(c.model);
  model->train();
  torch::manual_seed(7);
  const auto tokens = torch::randint(0, 64, {2, 16}, torch::kLong);
  const auto labels = torch::randint(0, 64, {2, 16}, torch::kLong);
  const auto mask = torch::ones({2, 16});
  torch::manual_seed(9);  // dropout
  Pass p;
  p.loss = model->loss(tokens, labels, mask);
  p.loss.backward();
  if (model->offloader()) p.bytes = model->offloader()->bytes_by_module();
  for (const auto& item : model->named_parameters())
    if (item.value().grad().defined()) p.grads[item.key()] = item.value().grad().clone();
  return p;
}

TEST(ActivationOffload, EveryNamedModuleOffloadsBytes) {
  for (const auto& model : {std::vector<std::string>{}, mla_args()}) {
    const Pass plain = one_pass(with(model, moe_args()));
    const Pass offloaded = one_pass(with(with(model, moe_args()), offload(with(kAttention, {"expert_fc1", "moe_act"}))));
    EXPECT_TRUE(torch::equal(plain.loss, offloaded.loss));
    ASSERT_EQ(plain.grads.size(), offloaded.grads.size());
    for (const auto& [name, g] : plain.grads) EXPECT_TRUE(torch::equal(g, offloaded.grads.at(name))) << name;
    // attn_norm and qkv_linear keep the same tensor in standard attention (the norm is fused into
    // the QKV projection): it is counted under attn_norm.
    std::vector<std::string> named = {"attn_norm", "core_attn", "attn_proj", "mlp_norm", "expert_fc1", "moe_act"};
    if (!model.empty()) named.push_back("qkv_linear");  // MLA: the down projections' normed input
    for (const auto& module : named) EXPECT_GT(offloaded.bytes.count(module) ? offloaded.bytes.at(module) : 0, 0) << module;
    EXPECT_TRUE(plain.bytes.empty());
  }
  // qkv_linear alone (standard attention): the fused norm's input sum, counted under its name.
  const Pass qkv = one_pass(offload({"qkv_linear"}));
  ASSERT_EQ(qkv.bytes.size(), 1u);
  EXPECT_GT(qkv.bytes.at("qkv_linear"), 0);
}

TEST(ActivationOffload, SmallTensorsStayOnTheDevice) {
  auto args = offload(kAttention);
  args[2] = "1000000";  // --min-offloaded-tensor-size above every activation of the tiny model
  const Pass p = one_pass(args);
  EXPECT_TRUE(p.bytes.empty());
}

// The offloader's own bookkeeping: released until the backward pass reaches the module's output.
TEST(ActivationOffload, ReleasesTheDeviceCopyAndRefillsItBeforeTheModulesBackward) {
  ActivationOffloader offloader(0);
  offloader.begin_forward();
  const auto w = torch::randn({8, 8}, torch::requires_grad());
  const auto x = torch::randn({4, 8}, torch::requires_grad()) * 2;  // not a leaf: offloadable
  const auto ref = torch::mm(x, w).tanh().sum();
  ref.backward();
  const auto ref_gw = w.grad().clone();
  w.grad().zero_();

  auto group = offloader.begin("m", {x});
  ASSERT_NE(group, nullptr);
  auto y = torch::mm(x, w);  // saves x for w's gradient
  offloader.after(group, y);
  offloader.offload(group);
  EXPECT_EQ(x.storage().nbytes(), 0u);
  EXPECT_EQ(offloader.take_offloaded_bytes(), 4 * 8 * 4);
  EXPECT_EQ(offloader.take_offloaded_bytes(), 0);
  y.tanh().sum().backward();
  EXPECT_EQ(x.storage().nbytes(), size_t(4 * 8 * 4));
  EXPECT_TRUE(torch::equal(w.grad(), ref_gw));
  // Leaves (parameters, a stage's received input) are never offloaded.
  EXPECT_EQ(offloader.begin("m", {w}), nullptr);
  torch::NoGradGuard no_grad;
  EXPECT_EQ(offloader.begin("m", {x}), nullptr);
}

TEST(ActivationOffload, RefusesWhatMegatronRefuses) {
  const auto args = base_args();
  EXPECT_USER_ERROR(build(with(args, {"--fine-grained-activation-offloading"})), "needs --offload-modules");
  EXPECT_USER_ERROR(build(with(args, offload({"attn_proj"}))), "attn_proj cannot be set without core_attn");
  EXPECT_USER_ERROR(build(with(args, offload({"bogus"}))), "--offload-modules bogus: not a module");
  EXPECT_USER_ERROR(build(with(args, offload({"fused_group_mlp"}))), "fused_group_mlp");
  EXPECT_USER_ERROR(build(with(with(args, offload({"core_attn"})), {"--transformer-impl", "local"})),
                    "only supported with --transformer-impl transformer_engine");
  EXPECT_USER_ERROR(build(with(with(with(args, moe_args()), offload({"moe_act"})),
                               {"--recompute-granularity", "selective", "--recompute-modules", "moe"})),
                    "expert_fc1/moe_act cannot be combined with moe");
  EXPECT_USER_ERROR(build(with(with(args, offload({"core_attn"})), {"--activation-offload-fraction", "0.5"})),
                    "--activation-offload-fraction");
  EXPECT_USER_ERROR(build(with(with(args, offload({"core_attn"})), {"--delta-offload-bytes-across-pp-ranks", "1024"})),
                    "--delta-offload-bytes-across-pp-ranks");
  EXPECT_USER_ERROR(build(with(with(args, offload({"core_attn"})), {"--delay-offload-until-cuda-graph"})),
                    "--delay-offload-until-cuda-graph");
  EXPECT_NO_THROW(build(with(args, offload(kAttention))));
}

}  // namespace
}  // namespace fp8tron
