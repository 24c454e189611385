#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "models/gpt_model.h"
#include "models/linear/main_grads.h"
#include "models/linear/modules.h"
#include "tests/test_helpers.h"
#include "optim/mixed_precision_optimizer.h"
#include "trainer/cli/model_math.h"

namespace fp8tron {
using namespace fp8tron::testing;

ModelConfig model_config(std::initializer_list<std::string> extra = {}) {
  auto args = tiny_args({"--attention-dropout", "0", "--hidden-dropout", "0"});
  args.insert(args.end(), extra.begin(), extra.end());
  return build(args).model;
}

int64_t numel(GptModel& model) {
  int64_t n = 0;
  for (const auto& p : model->parameters()) n += p.numel();
  return n;
}

TEST(GptModel, ParameterCountMatchesClosedForm) {
  const std::vector<std::vector<std::string>> variants = {
      {},
      {"--swiglu"},
      {"--group-query-attention", "--num-query-groups", "2"},
      {"--normalization", "RMSNorm", "--disable-bias-linear"},
      {"--disable-bias-linear", "--add-qkv-bias"},
      {"--untie-embeddings-and-output-weights", "--position-embedding-type", "rope"},
      {"--qk-layernorm", "--kv-channels", "16", "--ffn-hidden-size", "48"},
      {"--qk-layernorm", "--normalization", "RMSNorm"},
  };
  for (const auto& v : variants) {
    auto args = tiny_args();
    args.insert(args.end(), v.begin(), v.end());
    ModelConfig m = build(args).model;
    GptModel model(m);
    EXPECT_EQ(numel(model), count_parameters(m).total) << "variant: " << (v.empty() ? "default" : v[0]);
  }
}

TEST(GptModel, MegatronParameterNames) {
  GptModel model(model_config({"--qk-layernorm", "--untie-embeddings-and-output-weights"}));
  auto params = model->named_parameters();
  for (const char* name : {"embedding.word_embeddings.weight", "embedding.position_embeddings.weight",
                           "decoder.layers.0.self_attention.linear_qkv.layer_norm_weight",
                           "decoder.layers.0.self_attention.linear_qkv.layer_norm_bias",
                           "decoder.layers.0.self_attention.linear_qkv.weight",
                           "decoder.layers.0.self_attention.linear_qkv.bias",
                           "decoder.layers.0.self_attention.q_layernorm.weight",
                           "decoder.layers.1.self_attention.linear_proj.weight",
                           "decoder.layers.1.mlp.linear_fc1.layer_norm_weight", "decoder.layers.1.mlp.linear_fc2.bias",
                           "decoder.final_layernorm.weight", "output_layer.weight"})
    EXPECT_TRUE(params.contains(name)) << name;
}

TEST(GptModel, MegatronInitialisation) {
  auto m = model_config({"--num-layers", "8", "--hidden-size", "256", "--num-attention-heads", "4"});
  torch::manual_seed(1);
  GptModel model(m);
  auto params = model->named_parameters();
  EXPECT_NEAR(params["decoder.layers.0.self_attention.linear_qkv.weight"].std().item<double>(), 0.02, 0.001);
  EXPECT_NEAR(params["decoder.layers.0.mlp.linear_fc2.weight"].std().item<double>(), 0.02 / std::sqrt(16.0), 0.0005);
  EXPECT_NEAR(params["decoder.layers.0.self_attention.linear_proj.weight"].std().item<double>(), 0.02 / 4, 0.0005);
  EXPECT_EQ(params["decoder.layers.0.mlp.linear_fc1.bias"].abs().sum().item<double>(), 0.0);
  EXPECT_EQ(params["decoder.final_layernorm.weight"].mean().item<double>(), 1.0);
  GptModel one_p(model_config({"--apply-layernorm-1p"}));
  EXPECT_EQ(one_p->named_parameters()["decoder.final_layernorm.weight"].abs().sum().item<double>(), 0.0);
}

// Changing a token must not change the logits of any earlier position.
TEST(GptModel, CausalMasking) {
  for (const char* pos : {"learned_absolute", "rope"}) {
    torch::manual_seed(3);
    GptModel model(model_config({"--position-embedding-type", pos, "--group-query-attention", "--num-query-groups", "2"}));
    model->eval();
    torch::NoGradGuard no_grad;
    auto tokens = torch::randint(0, 64, {2, 16}, torch::kInt64);
    auto changed = tokens.clone();
    changed.index_put_({torch::indexing::Slice(), 9}, (tokens.index({torch::indexing::Slice(), 9}) + 1) % 64);
    auto a = model->forward(tokens), b = model->forward(changed);
    auto before = torch::indexing::Slice(0, 9), after = torch::indexing::Slice(9, 16);
    EXPECT_TRUE(torch::allclose(a.index({torch::indexing::Slice(), before}), b.index({torch::indexing::Slice(), before}),
                                1e-6, 1e-6))
        << pos;
    EXPECT_FALSE(torch::allclose(a.index({torch::indexing::Slice(), after}), b.index({torch::indexing::Slice(), after})))
        << pos;
  }
}

TEST(GptModel, LossIsMaskedMeanCrossEntropy) {
  torch::manual_seed(4);
  GptModel model(model_config());
  model->eval();
  auto tokens = torch::randint(0, 64, {2, 16}, torch::kInt64);
  auto labels = torch::randint(0, 64, {2, 16}, torch::kInt64);
  auto mask = torch::ones({2, 16});
  mask.index_put_({0, torch::indexing::Slice(0, 8)}, 0.0);
  auto logits = model->forward(tokens).reshape({-1, 128});
  auto per_token = torch::nn::functional::cross_entropy(
      logits, labels.view({-1}), torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kNone));
  auto expected = (per_token * mask.view({-1})).sum() / 24.0;
  EXPECT_NEAR(model->loss(tokens, labels, mask).item<double>(), expected.item<double>(), 1e-5);
}

// --defer-embedding-wgrad-compute: the output layer's weight gradient waits for the drain, then
// equals the gradient autograd accumulates without the deferral; the other gradients do not wait.
TEST(GptModel, DeferredOutputWeightGradientWaitsForTheDrain) {
  const ModelConfig m = model_config({"--untie-embeddings-and-output-weights"});
  GptModel plain(m), deferred(m), limited(m);
  deferred->defer_output_wgrad(0);
  limited->defer_output_wgrad(1);
  torch::manual_seed(5);
  std::vector<torch::Tensor> tokens;
  for (int mb = 0; mb < 3; ++mb) tokens.push_back(torch::randint(0, 64, {2, 16}, torch::kInt64));
  for (auto* model : {&plain, &deferred, &limited})
    for (const auto& t : tokens) (*model)->loss(t, t.roll(-1, 1), torch::ones({2, 16})).backward();
  auto grad = [](GptModel& model, const std::string& name) { return model->named_parameters()[name].grad(); };
  const std::string out = "output_layer.weight";
  EXPECT_FALSE(grad(deferred, out).defined() && grad(deferred, out).abs().sum().item<double>() > 0)
      << "no weight gradient before the drain";
  ASSERT_TRUE(grad(limited, out).defined()) << "the micro-batches past the limit add theirs in backward";
  EXPECT_FALSE(torch::allclose(grad(limited, out), grad(plain, out))) << "the first micro-batch's still waits";
  deferred->drain_output_wgrad();
  limited->drain_output_wgrad();
  EXPECT_TRUE(torch::equal(grad(deferred, out), grad(plain, out))) << "every micro-batch deferred: the same sum";
  EXPECT_TRUE(torch::allclose(grad(limited, out), grad(plain, out), 1e-6, 1e-7));
  for (const auto& p : plain->named_parameters())
    if (p.key() != out) EXPECT_TRUE(torch::equal(p.value().grad(), grad(deferred, p.key()))) << p.key();
}

// bf16 parameters, fp32 gradient buffer: two micro-batches accumulate in fp32.
TEST(MixedPrecisionOptimizer, Bf16GradientsAccumulateInFp32) {
  auto m = model_config({"--bf16"});
  torch::manual_seed(5);
  GptModel model(m);
  std::vector<NamedParam> named;
  const auto infos = model->param_infos();
  for (const auto& item : model->named_parameters()) named.push_back({item.key(), item.value(), infos.at(item.key())});
  PrecisionConfig precision;
  precision.params_dtype = ParamDtype::Bf16;
  const ParallelState single = single_process_state();
  MixedPrecisionOptimizer optimizer(named, OptimizerConfig{}, precision, single, false);
  for (const auto& [name, p, info, chunk] : named) {
    EXPECT_EQ(p.scalar_type(), torch::kBFloat16) << name;
    EXPECT_EQ(p.grad().scalar_type(), torch::kFloat32) << name;
  }
  auto tokens = torch::randint(0, 64, {2, 16}, torch::kInt64);
  auto mask = torch::ones({2, 16});
  model->loss(tokens, tokens, mask).backward();
  auto once = optimizer.main_grads().clone();
  EXPECT_GT(once.abs().sum().item<double>(), 0.0);
  model->loss(tokens, tokens, mask).backward();
  // Same micro-batch twice: the buffer holds exactly twice the first gradient (fp32 adds).
  EXPECT_TRUE(torch::allclose(optimizer.main_grads(), 2 * once, 1e-6, 1e-7));
  for (const auto& [name, p, info, chunk] : named) EXPECT_EQ(p.grad().scalar_type(), torch::kFloat32) << name;
}

// Gradients that FP8 wgrad GEMMs overwrite are left alone by zero_grad; the rest is zeroed.
TEST(MixedPrecisionOptimizer, SkipZeroingLeavesOnlyTheNamedGradients) {
  auto a = torch::randn({4, 3}).requires_grad_(true), b = torch::randn({3}).requires_grad_(true),
       c = torch::randn({5, 2}).requires_grad_(true);
  const ParallelState single = single_process_state();
  ParamInfo info;
  MixedPrecisionOptimizer optimizer({{"a.weight", a, info}, {"b.bias", b, info}, {"c.weight", c, info}}, OptimizerConfig{},
                                    PrecisionConfig{}, single, false);
  optimizer.skip_zeroing({a, c});
  for (auto* t : {&a, &b, &c}) t->mutable_grad().fill_(7.0);
  optimizer.zero_grad();
  EXPECT_TRUE(torch::equal(a.grad(), torch::full({4, 3}, 7.0)));
  EXPECT_TRUE(torch::equal(c.grad(), torch::full({5, 2}, 7.0)));
  EXPECT_TRUE(torch::equal(b.grad(), torch::zeros({3})));
  // Everything outside the skipped parameters (padding included) is zero.
  EXPECT_EQ(optimizer.main_grads().sum().item<double>(), 7.0 * 22);
}

// The bf16 linears whose gradients only their GEMMs write: every linear's weight and bias, not the
// norms, embeddings or the tied output layer (the word embedding's gradient also comes from the
// embedding's backward); the untied output layer's weight is one of them.
TEST(GemmWrittenParams, AreTheLinearsWeightsAndBiases) {
  const auto names_of = [](GptModel& model) {
    std::set<std::string> names;
    const auto written = gemm_written_params(*model);
    for (const auto& item : model->named_parameters())
      for (const auto& p : written)
        if (p.is_same(item.value())) names.insert(item.key());
    EXPECT_EQ(names.size(), written.size()) << "a parameter listed twice or not the model's";
    return names;
  };
  GptModel tied(model_config());
  std::set<std::string> expected;
  for (const std::string layer : {"decoder.layers.0.", "decoder.layers.1."})
    for (const std::string linear : {"self_attention.linear_qkv.", "self_attention.linear_proj.", "mlp.linear_fc1.",
                                     "mlp.linear_fc2."})
      for (const std::string p : {"weight", "bias"}) expected.insert(layer + linear + p);
  EXPECT_EQ(names_of(tied), expected);
  GptModel untied(model_config({"--untie-embeddings-and-output-weights", "--disable-bias-linear"}));
  const auto names = names_of(untied);
  EXPECT_EQ(names.size(), 2u * 4 + 1);
  EXPECT_TRUE(names.count("output_layer.weight"));
  for (const auto& n : names) EXPECT_EQ(n.find("bias"), std::string::npos) << n;
}

// A registered main gradient is taken once per step (the first GEMM writes it), not at all when it
// is not registered or was replaced, and one no GEMM wrote is zeroed before the step uses it.
TEST(MainGrads, GrantsOneFirstWritePerStepAndZeroesTheUnwritten) {
  auto a = torch::ones({3}).requires_grad_(true), b = torch::ones({2}).requires_grad_(true),
       c = torch::ones({2}).requires_grad_(true);
  for (auto* t : {&a, &b, &c}) t->mutable_grad() = torch::full(t->sizes(), 5.0);
  MainGrads g;
  g.own({a, b});
  g.new_step();
  EXPECT_TRUE(g.take(a));
  EXPECT_FALSE(g.take(a)) << "the second micro-batch adds";
  EXPECT_FALSE(g.take(c)) << "not registered";
  g.zero_unwritten();
  EXPECT_TRUE(torch::equal(a.grad(), torch::full({3}, 5.0))) << "written this step: kept";
  EXPECT_TRUE(torch::equal(b.grad(), torch::zeros({2}))) << "no GEMM wrote it: zeroed";
  EXPECT_TRUE(torch::equal(c.grad(), torch::full({2}, 5.0)));
  EXPECT_FALSE(g.take(b)) << "zeroed counts as written";
  g.new_step();
  EXPECT_TRUE(g.take(a));
  EXPECT_TRUE(g.take(b));
  g.new_step();
  b.mutable_grad() = torch::zeros({2});  // another buffer: no longer the registered main gradient
  EXPECT_FALSE(g.take(b));
  g.own({});
  g.new_step();
  EXPECT_FALSE(g.take(a));
  EXPECT_EQ(g.granted(), 3u);
}

// Two models in one process with different settings: each module follows its own model's
// (gradient-accumulation fusion on in one, off in the other), and the first writes one model
// registers are not the other's.
TEST(MainGrads, TwoModelsKeepTheirOwnSettings) {
  const ModelConfig m = model_config();
  const TensorParallelContext tp{make_self_communicator("tp", 0), 0, 1, false};
  const auto fused = make_main_grads(true), unfused = make_main_grads(false);
  const std::shared_ptr<fp8::Fp8Engine> no_fp8;
  const std::shared_ptr<MoeContext> no_moe;
  GptModel a(m, tp, StageSpec::whole(m), no_fp8, no_moe, ContextParallelContext{}, fused);
  GptModel b(m, tp, StageSpec::whole(m), no_fp8, no_moe, ContextParallelContext{}, unfused);
  EXPECT_EQ(a->main_grads().get(), fused.get());
  EXPECT_EQ(b->main_grads().get(), unfused.get());
  const auto plans_a = linear_plans(*a), plans_b = linear_plans(*b);
  ASSERT_FALSE(plans_a.empty());
  ASSERT_EQ(plans_a.size(), plans_b.size());
  for (size_t i = 0; i < plans_a.size(); ++i) {
    EXPECT_TRUE(plans_a[i].second.main_grad_fusion) << plans_a[i].first;
    EXPECT_FALSE(plans_b[i].second.main_grad_fusion) << plans_b[i].first;
    EXPECT_NE(plans_a[i].second.describe(), plans_b[i].second.describe());
  }
  // Model a's first writes: registered in a's settings only.
  auto weight = a->named_parameters()["decoder.layers.0.mlp.linear_fc1.weight"];
  weight.mutable_grad() = torch::zeros_like(weight);
  fused->own({weight});
  fused->new_step();
  unfused->new_step();
  EXPECT_FALSE(unfused->take(weight)) << "b knows nothing of a's registrations";
  EXPECT_TRUE(fused->take(weight));
  // Each keeps working with its own setting: a step of each changes its weights.
  auto tokens = torch::randint(0, m.vocab_size, {2, m.seq_length}, torch::kInt64);
  for (auto* model : {&a, &b}) {
    const auto loss = (*model)->loss(tokens, tokens, torch::ones({2, m.seq_length}));
    loss.backward();
    EXPECT_TRUE(std::isfinite(loss.item<double>()));
  }
}

// One AdamW step over the flat buffers equals torch::optim::AdamW (decoupled weight decay),
// with no decay on biases and norm weights, after clipping to the global norm.
TEST(MixedPrecisionOptimizer, AdamWMatchesReference) {
  auto w = torch::randn({4, 3}), b = torch::randn({3}), gw = torch::randn({4, 3}), gb = torch::randn({3});
  auto w_ref = w.clone().requires_grad_(true), b_ref = b.clone().requires_grad_(true);
  auto w_ours = w.clone().requires_grad_(true), b_ours = b.clone().requires_grad_(true);
  OptimizerConfig oc;
  oc.clip_grad = 1.0;
  const ParallelState single = single_process_state();
  ParamInfo info;
  MixedPrecisionOptimizer ours({{"layer.weight", w_ours, info}, {"layer.bias", b_ours, info}}, oc, PrecisionConfig{}, single, false);
  w_ours.mutable_grad().copy_(gw);
  b_ours.mutable_grad().copy_(gb);
  auto result = ours.step(/*lr=*/0.1, /*weight_decay=*/0.01, 1.0);

  const double norm = torch::cat({gw.view(-1), gb}).norm().item<double>();
  EXPECT_NEAR(result.grad_norm.item<double>(), norm, 1e-5);
  const double coeff = std::min(1.0, 1.0 / (norm + 1e-6));
  w_ref.mutable_grad() = gw * coeff;
  b_ref.mutable_grad() = gb * coeff;
  torch::optim::AdamW decay({w_ref}, torch::optim::AdamWOptions(0.1).betas({0.9, 0.999}).eps(1e-8).weight_decay(0.01));
  torch::optim::AdamW no_decay({b_ref}, torch::optim::AdamWOptions(0.1).betas({0.9, 0.999}).eps(1e-8).weight_decay(0.0));
  decay.step();
  no_decay.step();
  EXPECT_TRUE(torch::allclose(w_ours, w_ref, 1e-6, 1e-6));
  EXPECT_TRUE(torch::allclose(b_ours, b_ref, 1e-6, 1e-6));
}

TEST(MixedPrecisionOptimizer, NonFiniteGradientSkipsTheStep) {
  auto w = torch::randn({4, 3}).requires_grad_(true);
  auto before = w.detach().clone();
  const ParallelState single = single_process_state();
  MixedPrecisionOptimizer opt({{"w", w, ParamInfo{}}}, OptimizerConfig{}, PrecisionConfig{}, single, false);
  w.mutable_grad().fill_(1.0);
  w.mutable_grad()[0][0] = std::numeric_limits<float>::infinity();
  auto r = opt.step(0.1, 0.0, 1.0);
  EXPECT_EQ(r.found_inf.item<float>(), 1.0f);
  EXPECT_TRUE(torch::equal(w.detach(), before));
}

}  // namespace fp8tron
