// Maximal Update Parametrization (--use-mup) as Megatron-Core does it: the config's derived values
// (TransformerConfig.__post_init__), the rules and warnings, which parameters take which learning
// rate and Adam epsilon (get_mup_config_overrides) on a tiny GPT, the optimizer applying them, the
// initialisation of a wide model against the base one, and the multipliers in the forward pass.
#include <gtest/gtest.h>

#include <cmath>

#include "models/attention/core_attention.h"
#include "models/gpt_model.h"
#include "optim/mixed_precision_optimizer.h"
#include "optim/param_groups.h"
#include "parallel/parallel_state.h"
#include "tests/test_helpers.h"

namespace fp8tron {
using namespace fp8tron::testing;

namespace {
// The tiny GPT (hidden 32, 4 heads of 8) without dropout.
std::vector<std::string> mup_args(std::initializer_list<std::string> extra) {
  auto args = tiny_args({"--attention-dropout", "0", "--hidden-dropout", "0"});
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

bool warned(const Config& c, const std::string& needle) {
  for (const auto& w : c.hint_warnings)
    if (w.find(needle) != std::string::npos) return true;
  return false;
}
}  // namespace

TEST(Mup, ConfigDerivedAsMegatron) {
  const Config c = build(mup_args({"--use-mup", "--mup-base-hidden-size", "16"}));
  const MupConfig& u = c.model.mup;
  EXPECT_TRUE(u.enabled);
  EXPECT_EQ(u.base_hidden_size, 16);
  EXPECT_DOUBLE_EQ(u.width_mult, 2.0);                 // hidden / base hidden
  EXPECT_DOUBLE_EQ(u.output_mult, 0.5);                // left at 1: 1 / width_mult
  EXPECT_DOUBLE_EQ(u.embedding_mult, 1.0);
  EXPECT_DOUBLE_EQ(*u.softmax_scale, 1.0 / 8.0);       // 1 / kv_channels^1
  EXPECT_DOUBLE_EQ(*c.optimizer.mup_width_mult, 2.0);  // what the optimizer groups scale by
  // The base head dimension anchors the scale; the power 0.5 is standard attention.
  EXPECT_DOUBLE_EQ(*build(mup_args({"--use-mup", "--mup-base-head-dim", "4"})).model.mup.softmax_scale, 2.0 / 8.0);
  EXPECT_DOUBLE_EQ(*build(mup_args({"--use-mup", "--mup-attn-scale-power", "0.5"})).model.mup.softmax_scale,
                   1.0 / std::sqrt(8.0));
  // An explicit output multiplier is kept; the base defaults to the hidden size (width 1), where
  // the output multiplier stays 1 and the attention still takes 1/d.
  EXPECT_DOUBLE_EQ(build(mup_args({"--use-mup", "--mup-base-hidden-size", "16", "--mup-output-mult", "3"})).model.mup.output_mult, 3.0);
  const Config base = build(mup_args({"--use-mup"}));
  EXPECT_DOUBLE_EQ(base.model.mup.width_mult, 1.0);
  EXPECT_DOUBLE_EQ(base.model.mup.output_mult, 1.0);
  EXPECT_DOUBLE_EQ(*base.model.mup.softmax_scale, 1.0 / 8.0);
  EXPECT_FALSE(mup_lr_mult(base.optimizer));  // Megatron adds no optimizer override at width 1
  // Without --use-mup nothing is derived, and given --mup-* flags are said to do nothing.
  const Config off = build(mup_args({"--mup-embedding-mult", "2", "--mup-base-hidden-size", "16"}));
  EXPECT_FALSE(off.model.mup.enabled);
  EXPECT_FALSE(off.model.mup.softmax_scale);
  EXPECT_FALSE(off.optimizer.mup_width_mult);
  EXPECT_TRUE(warned(off, "--mup-base-hidden-size, --mup-embedding-mult have no effect without --use-mup"));
}

TEST(Mup, Rules) {
  EXPECT_USER_ERROR(build(mup_args({"--use-mup", "--mup-base-hidden-size", "0"})), "--mup-base-hidden-size must be positive");
  EXPECT_USER_ERROR(build(mup_args({"--use-mup", "--mup-base-head-dim", "-4"})), "--mup-base-head-dim must be positive");
  EXPECT_USER_ERROR(build(mup_args({"--use-mup", "--mup-base-hidden-size", "16", "--mup-width-mult", "4"})),
                    "--mup-width-mult 4 disagrees with --hidden-size / --mup-base-hidden-size = 32 / 16 = 2");
  EXPECT_DOUBLE_EQ(build(mup_args({"--use-mup", "--mup-base-hidden-size", "16", "--mup-width-mult", "2"})).model.mup.width_mult, 2.0);
  // Megatron's warnings: --decoupled-lr keeps embedding and output out of MuP's LR scaling; Muon's
  // spectral scale mode stays on Muon's matrices.
  EXPECT_TRUE(warned(build(mup_args({"--use-mup", "--decoupled-lr", "1e-3"})),
                     "MuP Adam epsilon scaling remains applied to hidden matrix-like parameters"));
  EXPECT_TRUE(warned(build(mup_args({"--use-mup", "--optimizer", "muon"})), "Both MuP and muon_scale_mode=spectral"));
  EXPECT_FALSE(warned(build(mup_args({"--use-mup", "--optimizer", "muon", "--muon-scale-mode", "unit_rms_norm"})),
                      "muon_scale_mode"));
}

// Which parameter of a tiny GPT takes which learning-rate group and epsilon factor.
TEST(Mup, ParamGroupsOnTinyGpt) {
  const Config c = build(mup_args({"--use-mup", "--mup-base-hidden-size", "16", "--untie-embeddings-and-output-weights"}));
  GptModel model(c.model);
  const auto params = model->named_parameters();
  const std::string layer = "decoder.layers.0.";
  const std::vector<std::string> hidden = {layer + "self_attention.linear_qkv.weight", layer + "self_attention.linear_proj.weight",
                                           layer + "mlp.linear_fc1.weight", layer + "mlp.linear_fc2.weight"};
  const std::vector<std::string> vector_like = {"embedding.word_embeddings.weight", "embedding.position_embeddings.weight",
                                                "output_layer.weight", layer + "self_attention.linear_qkv.bias",
                                                layer + "self_attention.linear_qkv.layer_norm_weight", layer + "mlp.linear_fc2.bias",
                                                "decoder.final_layernorm.weight"};
  auto dim = [&](const std::string& name) {
    EXPECT_TRUE(params.contains(name)) << name;
    return params.contains(name) ? params[name].dim() : 0;
  };
  // Adam: hidden lr / m and eps / m; vector-like keep both.
  OptimizerConfig adam = c.optimizer;
  EXPECT_DOUBLE_EQ(*mup_lr_mult(adam), 0.5);
  for (const auto& n : hidden) {
    EXPECT_EQ(lr_group(n, dim(n), adam), LrGroup::Mup) << n;
    EXPECT_DOUBLE_EQ(adam_eps_mult(n, dim(n), adam), 0.5) << n;
  }
  for (const auto& n : vector_like) {
    EXPECT_EQ(lr_group(n, dim(n), adam), LrGroup::Base) << n;
    EXPECT_DOUBLE_EQ(adam_eps_mult(n, dim(n), adam), 1.0) << n;
  }
  // Every parameter is classified: hidden ones are exactly the matrices outside the embedding class.
  for (const auto& p : params)
    EXPECT_EQ(lr_group(p.key(), p.value().dim(), adam) == LrGroup::Mup,
              p.value().dim() >= 2 && p.key().find("embedding") == std::string::npos && p.key() != "output_layer.weight")
        << p.key();
  // SGD: vector-like lr x m, hidden base, no epsilon.
  OptimizerConfig sgd = adam;
  sgd.optimizer = "sgd";
  EXPECT_DOUBLE_EQ(*mup_lr_mult(sgd), 2.0);
  for (const auto& n : hidden) EXPECT_EQ(lr_group(n, dim(n), sgd), LrGroup::Base) << n;
  for (const auto& n : vector_like) {
    EXPECT_EQ(lr_group(n, dim(n), sgd), LrGroup::Mup) << n;
    EXPECT_DOUBLE_EQ(adam_eps_mult(n, dim(n), sgd), 1.0) << n;
  }
  // --decoupled-lr: the word embedding and output layer keep their decoupled rate (SGD included);
  // the position table stays MuP's under SGD.
  OptimizerConfig decoupled = adam;
  decoupled.decoupled_lr = 1e-3;
  sgd.decoupled_lr = 1e-3;
  for (const std::string n : {"embedding.word_embeddings.weight", "output_layer.weight"}) {
    EXPECT_EQ(lr_group(n, 2, decoupled), LrGroup::Decoupled) << n;
    EXPECT_EQ(lr_group(n, 2, sgd), LrGroup::Decoupled) << n;
  }
  EXPECT_EQ(lr_group("embedding.position_embeddings.weight", 2, sgd), LrGroup::Mup);
  EXPECT_EQ(lr_group(hidden[0], 2, decoupled), LrGroup::Mup);
  // Muon: its own matrices keep Muon's scaling, its scalar Adam keeps --adam-eps.
  OptimizerConfig muon = adam;
  muon.optimizer = "muon";
  for (const auto& n : hidden) {
    EXPECT_EQ(lr_group(n, 2, muon), LrGroup::Base) << n;
    EXPECT_DOUBLE_EQ(adam_eps_mult(n, 2, muon), 1.0) << n;
  }
  EXPECT_EQ(lr_group("decoder.layers.0.mlp.experts.stacked.weight", 3, muon), LrGroup::Mup);  // a non-Muon matrix
  // The last stage's copy of a tied embedding is embedding class.
  EXPECT_TRUE(is_mup_vector_like("output_layer_shared.weight", 2));
}

// Adam's first step moves each weight by lr x g / (|g| + eps): the MuP group by its own learning
// rate and epsilon / m, the rest by the base ones.
TEST(Mup, OptimizerStepUsesGroupLearningRateAndEpsilon) {
  auto fc = torch::ones({3, 2}).requires_grad_(true), emb = torch::ones({4, 2}).requires_grad_(true),
       bias = torch::ones({3}).requires_grad_(true);
  OptimizerConfig oc;
  oc.clip_grad = 0;
  oc.adam_eps = 1.0;  // large enough to see
  oc.mup_width_mult = 2.0;
  ParamInfo info;
  MixedPrecisionOptimizer opt({{"embedding.word_embeddings.weight", emb, info},
                               {"decoder.layers.0.mlp.linear_fc1.weight", fc, info},
                               {"decoder.layers.0.mlp.linear_fc1.bias", bias, info}},
                              oc, PrecisionConfig{}, single_process_state(), false);
  for (auto* t : {&emb, &fc, &bias}) t->mutable_grad().fill_(2.0);
  GroupLrs lrs;
  lrs.mup = 0.05;
  opt.step(/*lr=*/0.1, /*weight_decay=*/0.0, 1.0, lrs);
  EXPECT_TRUE(torch::allclose(fc.detach(), torch::full({3, 2}, 1 - 0.05 * 2 / (2 + 0.5))));  // MuP lr, eps / 2
  EXPECT_TRUE(torch::allclose(emb.detach(), torch::full({4, 2}, 1 - 0.1 * 2 / (2 + 1.0))));
  EXPECT_TRUE(torch::allclose(bias.detach(), torch::full({3}, 1 - 0.1 * 2 / (2 + 1.0))));
}

// A model 4x the base width: the hidden matrices' init std / 2 (output projections also /
// sqrt(2L)), the embedding and the untied output layer unscaled; the plain model as reference.
TEST(Mup, InitStdOfWideModel) {
  const std::vector<std::string> shape = {"--num-layers", "8", "--hidden-size", "256", "--num-attention-heads", "4",
                                          "--untie-embeddings-and-output-weights"};
  auto std_of = [&](bool mup) {
    auto args = mup_args({});
    args.insert(args.end(), shape.begin(), shape.end());
    if (mup) args.insert(args.end(), {"--use-mup", "--mup-base-hidden-size", "64"});
    torch::manual_seed(1);
    GptModel model(build(args).model);
    std::map<std::string, double> out;
    for (const auto& p : model->named_parameters()) out[p.key()] = p.value().std().item<double>();
    return out;
  };
  const auto plain = std_of(false), wide = std_of(true);
  const double depth = std::sqrt(16.0);
  for (const std::string n : {"self_attention.linear_qkv.weight", "mlp.linear_fc1.weight"}) {
    EXPECT_NEAR(plain.at("decoder.layers.0." + n), 0.02, 0.001) << n;
    EXPECT_NEAR(wide.at("decoder.layers.0." + n), 0.01, 0.0005) << n;
  }
  for (const std::string n : {"self_attention.linear_proj.weight", "mlp.linear_fc2.weight"}) {
    EXPECT_NEAR(plain.at("decoder.layers.0." + n), 0.02 / depth, 0.0003) << n;
    EXPECT_NEAR(wide.at("decoder.layers.0." + n), 0.01 / depth, 0.00015) << n;
  }
  for (const std::string n : {"embedding.word_embeddings.weight", "output_layer.weight"}) {
    EXPECT_NEAR(plain.at(n), 0.02, 0.001) << n;
    EXPECT_NEAR(wide.at(n), 0.02, 0.001) << n;
  }
}

// Width 1 with standard attention (--mup-attn-scale-power 0.5): the same initial weights as the
// plain model, so the logits are the plain model's times --mup-output-mult; the embedding
// multiplier equals scaling the input tables (untied, so the output layer stays).
TEST(Mup, ForwardMultipliers) {
  const std::vector<std::string> common = {"--untie-embeddings-and-output-weights"};
  auto make = [&](std::initializer_list<std::string> extra) {
    auto args = mup_args({});
    args.insert(args.end(), common.begin(), common.end());
    args.insert(args.end(), extra.begin(), extra.end());
    torch::manual_seed(7);
    GptModel model(build(args).model);
    model->eval();
    return model;
  };
  torch::NoGradGuard no_grad;
  const auto tokens = torch::randint(0, 64, {2, 16}, torch::kInt64);
  GptModel plain = make({});
  GptModel logits_only = make({"--use-mup", "--mup-attn-scale-power", "0.5", "--mup-output-mult", "0.25"});
  const auto reference = plain->forward(tokens);
  EXPECT_TRUE(torch::allclose(logits_only->forward(tokens), reference * 0.25, 1e-5, 1e-6));
  GptModel both = make({"--use-mup", "--mup-attn-scale-power", "0.5", "--mup-output-mult", "0.25", "--mup-embedding-mult", "3"});
  auto plain_params = plain->named_parameters();
  for (const std::string n : {"embedding.word_embeddings.weight", "embedding.position_embeddings.weight"}) plain_params[n].mul_(3.0);
  EXPECT_TRUE(torch::allclose(both->forward(tokens), plain->forward(tokens) * 0.25, 1e-5, 1e-6));
  // MuP's default 1/d attention changes the logits.
  GptModel mup_attention = make({"--use-mup", "--mup-output-mult", "0.25"});
  EXPECT_FALSE(torch::allclose(mup_attention->forward(tokens), reference * 0.25, 1e-5, 1e-6));
}

// The core attention uses the MuP softmax scale: softmax(q k^T x scale) v, causal.
TEST(Mup, AttentionSoftmaxScale) {
  ModelConfig m = build(mup_args({"--use-mup", "--mup-base-head-dim", "2"})).model;
  const double scale = *m.mup.softmax_scale;
  ASSERT_DOUBLE_EQ(scale, std::sqrt(2.0) / 8.0);
  CoreAttention attention(m, 0, ContextParallelContext{});
  torch::manual_seed(3);
  const int64_t s = 6, b = 2, h = 4, d = 8;
  auto q = torch::randn({s, b, h, d}), k = torch::randn({s, b, h, d}), v = torch::randn({s, b, h, d});
  const auto out = attention.forward(q, k, v, {}, 0.0, false);
  auto qh = q.permute({1, 2, 0, 3}), kh = k.permute({1, 2, 0, 3}), vh = v.permute({1, 2, 0, 3});
  auto scores = torch::matmul(qh, kh.transpose(-1, -2)) * scale;
  scores = scores.masked_fill(torch::ones({s, s}, torch::kBool).triu(1), -INFINITY);
  const auto expected = torch::matmul(torch::softmax(scores, -1), vh).permute({2, 0, 1, 3}).reshape({s, b, h * d});
  EXPECT_TRUE(torch::allclose(out, expected, 1e-5, 1e-6));
}

}  // namespace fp8tron
