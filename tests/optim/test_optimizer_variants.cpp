// Optimizer variants against hand and reference computations: Megatron's weight-decay and
// decoupled-learning-rate groups (SGD steps written out), Muon's Newton-Schulz iteration and
// update (reference values computed offline with PyTorch from Emerging-Optimizers' algorithm),
// one Muon step by hand.
#include <gtest/gtest.h>

#include <cmath>

#include "parallel/parallel_state.h"
#include "tests/test_helpers.h"
#include "optim/mixed_precision_optimizer.h"
#include "optim/muon.h"
#include "optim/param_groups.h"

namespace fp8tron {

torch::Tensor values(std::initializer_list<float> v, std::vector<int64_t> shape) {
  return torch::tensor(std::vector<float>(v)).view(shape);
}

TEST(ParamGroups, MegatronRules) {
  OptimizerConfig c;
  EXPECT_TRUE(applies_weight_decay("decoder.layers.0.mlp.linear_fc1.weight", 2, c));
  EXPECT_FALSE(applies_weight_decay("decoder.layers.0.mlp.linear_fc1.bias", 1, c));
  EXPECT_FALSE(applies_weight_decay("decoder.layers.0.mlp.linear_fc1.layer_norm_weight", 1, c));
  EXPECT_FALSE(applies_weight_decay("decoder.layers.0.self_attention.q_layernorm.weight", 1, c));
  c.apply_wd_to_qk_layernorm = true;
  EXPECT_TRUE(applies_weight_decay("decoder.layers.0.self_attention.q_layernorm.weight", 1, c));
  EXPECT_TRUE(applies_weight_decay("decoder.layers.0.self_attention.k_layernorm.bias", 1, c));
  // MLA's q/kv norms are fused into the up projections: Megatron's name match misses them too.
  EXPECT_FALSE(applies_weight_decay("decoder.layers.0.self_attention.linear_q_up_proj.layer_norm_weight", 1, c));
  EXPECT_TRUE(is_embedding_or_output("embedding.word_embeddings.weight"));
  EXPECT_TRUE(is_embedding_or_output("output_layer.weight"));
  EXPECT_FALSE(is_embedding_or_output("embedding.position_embeddings.weight"));
  c.optimizer = "muon";
  EXPECT_TRUE(uses_muon("decoder.layers.0.self_attention.linear_kv_down_proj.weight", 2, c));
  EXPECT_FALSE(uses_muon("output_layer.weight", 2, c));
  EXPECT_FALSE(uses_muon("decoder.final_layernorm.weight", 1, c));
}

// SGD without momentum: p <- p - lr_group (g + wd p) with Megatron's groups.
TEST(ParamGroups, DecoupledLearningRateAndQkNormDecay) {
  auto emb = torch::ones({4, 2}).requires_grad_(true), fc = torch::ones({3, 2}).requires_grad_(true),
       qn = torch::ones({2}).requires_grad_(true), bias = torch::ones({3}).requires_grad_(true);
  OptimizerConfig oc;
  oc.optimizer = "sgd";
  oc.sgd_momentum = 0;
  oc.clip_grad = 0;
  oc.decoupled_lr = 0.5;
  oc.apply_wd_to_qk_layernorm = true;
  const ParallelState single = single_process_state();
  ParamInfo info;
  MixedPrecisionOptimizer opt({{"embedding.word_embeddings.weight", emb, info},
                               {"decoder.layers.0.mlp.linear_fc1.weight", fc, info},
                               {"decoder.layers.0.self_attention.q_layernorm.weight", qn, info},
                               {"decoder.layers.0.mlp.linear_fc1.bias", bias, info}},
                              oc, PrecisionConfig{}, single, false);
  for (auto* t : {&emb, &fc, &qn, &bias}) t->mutable_grad().fill_(2.0);
  opt.step(/*lr=*/0.1, /*weight_decay=*/0.25, 1.0, GroupLrs{/*decoupled=*/0.5});
  EXPECT_TRUE(torch::allclose(emb.detach(), torch::full({4, 2}, 1 - 0.5 * (2 + 0.25))));  // decoupled lr
  EXPECT_TRUE(torch::allclose(fc.detach(), torch::full({3, 2}, 1 - 0.1 * (2 + 0.25))));
  EXPECT_TRUE(torch::allclose(qn.detach(), torch::full({2}, 1 - 0.1 * (2 + 0.25))));   // QK norm decays
  EXPECT_TRUE(torch::allclose(bias.detach(), torch::full({3}, 1 - 0.1 * 2)));          // bias does not
}

// x[i][j] = sin(1 + 3i + 0.7j); the expected values are Emerging-Optimizers' newton_schulz (quintic,
// 5 steps) run with PyTorch 2.11 in fp32 and in bf16 (--muon-fp32-matmul-prec medium).
TEST(Muon, NewtonSchulzMatchesReference) {
  auto x = torch::empty({4, 6});
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 6; ++j) x[i][j] = std::sin(1.0 + i * 3 + j * 0.7);
  const auto fp32 = values({0.4310447, 0.2424373, -0.0601952, -0.3345145, -0.4515102, -0.3561463, -0.2762815, -0.2715352,
                            -0.1390915, 0.0587785, 0.2289948, 0.2915216, 0.1159823, 0.2952085, 0.3355849, 0.2181415,
                            -0.0019048, -0.2210561, 0.0466331, -0.3129657, -0.5253747, -0.4906876, -0.2252241, 0.1461616},
                           {4, 6});
  EXPECT_TRUE(torch::allclose(newton_schulz(x, 5, "quintic", false), fp32, 1e-5, 1e-5));
  // Tall matrices run transposed: the same result, transposed.
  EXPECT_TRUE(torch::allclose(newton_schulz(x.t().contiguous(), 5, "quintic", false), fp32.t(), 1e-5, 1e-5));
  const auto bf16 = values({0.515625, 0.3476562, -0.0480957, -0.3671875, -0.4121094, -0.2099609, -0.2539062, -0.0203857,
                            -0.1166992, -0.0534668, 0.2675781, 0.5390625, -0.0688477, 0.484375, 0.3476562, 0.1005859,
                            -0.0300293, -0.1787109, -0.0917969, -0.2695312, -0.5273438, -0.5351562, -0.2539062, 0.0991211},
                           {4, 6});
  EXPECT_TRUE(torch::allclose(newton_schulz(x, 5, "quintic", true), bf16, 0, 1e-2));
  EXPECT_DOUBLE_EQ(muon_scale_factor(12, 4, "spectral"), std::sqrt(12.0));
  EXPECT_DOUBLE_EQ(muon_scale_factor(12, 4, "unit_rms_norm"), std::sqrt(3.0));
  EXPECT_DOUBLE_EQ(muon_scale_factor(4, 12, "shape_scaling"), 1.0);
}

// A fused QKV weight (2 query groups of [q 2 | k 2 | v 2] rows, 4 inputs): Megatron splits it into
// Q, K and V [4, 4] before orthogonalising; without the split it is one [12, 4] matrix. Reference
// values from Megatron's TensorParallelMuon.orthogonalize with PyTorch (spectral, extra 0.2).
TEST(Muon, QkvSplitUpdateMatchesReference) {
  auto u = torch::empty({12, 4});
  for (int i = 0; i < 12; ++i)
    for (int j = 0; j < 4; ++j) u[i][j] = std::cos(0.3 + i * 1.1 + j * 0.45);
  MuonConfig c;
  c.matmul_precision = "high";
  c.extra_scale_factor = 0.2;
  MuonParam p;
  p.info.global_shape = {12, 4};
  p.info.partition_dim = 0;
  p.qkv = true;
  p.qkv_rows = {2, 2, 2};
  auto self = make_self_communicator("tp", 0);
  const auto split = values({0.2330494, 0.1705562, 0.0741107, -0.0370938, 0.0528236, -0.0508245, -0.1443584, -0.2091415,
                             -0.0786195, -0.1450834, -0.1826633, -0.1838701, -0.2037863, -0.1055978, 0.0136153, 0.1301159,
                             -0.123253, 0.0100102, 0.1412836, 0.2444214, 0.1778529, 0.1598867, 0.1100841, 0.0383602,
                             0.2029601, 0.1172604, 0.0082081, -0.1024779, -0.022896, -0.11598, -0.1859653, -0.2189314,
                             -0.133478, -0.151774, -0.1398472, -0.10008, -0.1984734, -0.0663695, 0.0789485, 0.2085501,
                             -0.035402, 0.0638177, 0.1503276, 0.2069133, 0.2402916, 0.1737803, 0.072671, -0.042907},
                            {12, 4});
  EXPECT_TRUE(torch::allclose(muon_update(u, p, c, *self), split, 1e-5, 1e-5));
  c.split_qkv = false;  // --muon-no-split-qkv
  const auto whole = values({0.2194936, 0.1405957, 0.0337108, -0.0798919, 0.1015204, -0.0204836, -0.1384169, -0.2287804,
                             -0.1273938, -0.1591842, -0.1592742, -0.1276594, -0.2170912, -0.1239219, -0.0060838, 0.1129734,
                             -0.0695485, 0.0467586, 0.1537601, 0.2301459, 0.153994, 0.1663475, 0.1455698, 0.0958135,
                             0.209254, 0.1041462, -0.0216999, -0.1432231, 0.0358381, -0.0718654, -0.165255, -0.2257456,
                             -0.1767437, -0.1693376, -0.1282221, -0.0615703, -0.1961768, -0.0817604, 0.0489363, 0.1698885,
                             -0.0012272, 0.0951671, 0.1726149, 0.2156924, 0.1950649, 0.1680948, 0.1076565, 0.0257879},
                            {12, 4});
  EXPECT_TRUE(torch::allclose(muon_update(u, p, c, *self), whole, 1e-5, 1e-5));
}

// One Muon step by hand: decoupled decay, momentum EMA, Nesterov direction, scaled update; the
// 1-D parameter takes Adam.
TEST(Muon, StepByHand) {
  auto w = torch::full({4, 6}, 0.5).requires_grad_(true), b = torch::zeros({6}).requires_grad_(true);
  OptimizerConfig oc;
  oc.optimizer = "muon";
  oc.clip_grad = 0;
  oc.muon.matmul_precision = "high";
  oc.muon.nesterov = true;
  oc.muon.momentum = 0.9;
  const ParallelState single = single_process_state();
  ParamInfo info;
  MixedPrecisionOptimizer opt({{"decoder.layers.0.mlp.linear_fc1.weight", w, info}, {"decoder.layers.0.mlp.linear_fc1.bias", b, info}},
                              oc, PrecisionConfig{}, single, false);
  auto g = torch::empty({4, 6});
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 6; ++j) g[i][j] = std::sin(1.0 + i * 3 + j * 0.7);
  w.mutable_grad().copy_(g);
  b.mutable_grad().fill_(1.0);
  const double lr = 0.1, wd = 0.2;
  opt.step(lr, wd, 1.0);
  auto m = 0.1 * g;                    // m <- m + (1 - 0.9)(g - m) from 0
  auto direction = g + 0.9 * (m - g);  // Nesterov
  auto expected = 0.5 * (1 - lr * wd) - lr * newton_schulz(direction, 5, "quintic", false) * std::sqrt(6.0);
  EXPECT_TRUE(torch::allclose(w.detach(), expected, 1e-5, 1e-6));
  EXPECT_TRUE(torch::allclose(b.detach(), torch::full({6}, -lr), 1e-5, 1e-6));  // Adam's first step: -lr sign(g)
}

}  // namespace fp8tron
