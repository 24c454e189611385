// The MoE router's math against hand-computed values (docs/moe.md's worked examples): top-k
// selection and probabilities for each score function, group-limited routing, capacity dropping
// by probs and by position, padding, sinkhorn, the balancing losses (1.0 at perfect balance),
// the z-loss, the expert-bias update, and how the auxiliary losses reach the gradients.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "models/moe/aux_loss.h"
#include "models/moe/moe_context.h"
#include "models/moe/router.h"
#include "models/moe/routing.h"
#include "parallel/parallel_state.h"
#include "tests/test_helpers.h"

namespace fp8tron {
namespace {

// T = 4 tokens, E = 4 experts.
torch::Tensor example_logits() {
  return torch::tensor({{2.0, 1.0, 0.0, -1.0}, {0.0, 0.5, 3.0, 1.0}, {1.0, -2.0, 1.5, 0.0}, {-1.0, 2.0, 0.0, 2.5}},
                       torch::kFloat64);
}

moe::TopKOptions options(MoeScoreFunction f, bool pre_softmax = false, int64_t k = 2) {
  moe::TopKOptions o;
  o.topk = k;
  o.score_function = f;
  o.pre_softmax = pre_softmax;
  return o;
}

// Expected probs as [T, E] from per-token (expert, prob) pairs.
torch::Tensor dense_probs(const std::vector<std::vector<std::pair<int, double>>>& rows, int64_t experts) {
  auto p = torch::zeros({int64_t(rows.size()), experts}, torch::kFloat64);
  for (size_t t = 0; t < rows.size(); ++t)
    for (auto [e, v] : rows[t]) p[int64_t(t)][e] = v;
  return p;
}

void expect_routing(const moe::Routing& r, const torch::Tensor& want, double tol = 1e-6) {
  EXPECT_TRUE(torch::allclose(r.probs, want, 0, tol)) << r.probs << "\nexpected\n" << want;
  EXPECT_TRUE(torch::equal(r.map, want != 0)) << r.map;
}

TEST(MoeRouting, PostSoftmaxRenormalisesOverTheSelectedLogits) {
  auto r = moe::topk_routing(example_logits(), options(MoeScoreFunction::kSoftmax));
  expect_routing(r, dense_probs({{{0, 0.731059}, {1, 0.268941}},
                                 {{2, 0.880797}, {3, 0.119203}},
                                 {{2, 0.622459}, {0, 0.377541}},
                                 {{3, 0.622459}, {1, 0.377541}}},
                                4));
}

TEST(MoeRouting, PreSoftmaxTakesTheFullSoftmaxWithoutRenormalising) {
  auto r = moe::topk_routing(example_logits(), options(MoeScoreFunction::kSoftmax, true));
  expect_routing(r, dense_probs({{{0, 0.643914}, {1, 0.236883}},
                                 {{2, 0.789137}, {3, 0.106798}},
                                 {{2, 0.537675}, {0, 0.326117}},
                                 {{3, 0.581797}, {1, 0.352878}}},
                                4));
}

TEST(MoeRouting, SigmoidSelectsWithTheExpertBiasButWeightsWithoutIt) {
  auto bias = torch::tensor({0.0, 0.0, 0.5, -0.5}, torch::kFloat32);
  auto r = moe::topk_routing(example_logits(), options(MoeScoreFunction::kSigmoid), bias);
  // Token 0: expert 2 wins through its bias although sigmoid(1) > sigmoid(0).
  expect_routing(r, dense_probs({{{2, 0.362110}, {0, 0.637890}},
                                 {{2, 0.604796}, {1, 0.395204}},
                                 {{2, 0.527933}, {0, 0.472067}},
                                 {{2, 0.362110}, {1, 0.637890}}},
                                4));
  // sqrtsoftplus is treated exactly like sigmoid, on sqrt(softplus(l)).
  auto sq = moe::topk_routing(example_logits(), options(MoeScoreFunction::kSqrtSoftplus));
  auto s = torch::nn::functional::softplus(example_logits()).sqrt();
  auto want = torch::zeros_like(s);
  for (int64_t t = 0; t < 4; ++t) {
    auto [v, i] = s[t].topk(2);
    want[t].index_put_({i}, v / v.sum());
  }
  expect_routing(sq, want);
}

TEST(MoeRouting, ScalingFactorMultipliesTheProbs) {
  auto o = options(MoeScoreFunction::kSigmoid);
  const auto plain = moe::topk_routing(example_logits(), o);
  o.scaling_factor = 2.5;
  const auto scaled = moe::topk_routing(example_logits(), o);
  EXPECT_TRUE(torch::allclose(scaled.probs, plain.probs * 2.5));
  EXPECT_TRUE(torch::equal(scaled.map, plain.map));
}

TEST(MoeRouting, GroupLimitedTopKKeepsTheBestGroups) {
  // E = 8 in G = 4 groups, 2 groups per token, k = 2, pre-softmax scores.
  auto logits = torch::tensor({{0.1, 0.9, 0.3, 0.2, 0.8, 0.7, 0.05, 0.4}}, torch::kFloat64);
  auto o = options(MoeScoreFunction::kSoftmax, true);
  o.num_groups = 4;
  o.group_topk = 2;
  const auto r = moe::topk_routing(logits, o);
  // Group scores (top-1 each): [0.190395, 0.104491, 0.172276, 0.115480] -> groups {0, 2}.
  expect_routing(r, dense_probs({{{1, 0.190395}, {4, 0.172276}}}, 8));
  // One group per token: only group 0 (best expert 0.9) remains.
  o.group_topk = 1;
  o.topk = 1;
  const auto one = moe::topk_routing(logits, o);
  EXPECT_TRUE(one.map[0][1].item<bool>());
}

TEST(MoeRouting, SinkhornBalancesAndWeightsWithTheActivation) {
  auto cost = torch::tensor({{3.0, 0.0}, {2.5, 0.0}, {2.0, 0.1}, {1.5, 0.2}}, torch::kFloat64);
  auto n = moe::sinkhorn(cost);
  // Uniform marginals: every row sums to 1/T, every column to 1/E.
  EXPECT_TRUE(torch::allclose(n.sum(1), torch::full({4}, 0.25, torch::kFloat64), 0, 1e-3));
  EXPECT_TRUE(torch::allclose(n.sum(0), torch::full({2}, 0.5, torch::kFloat64), 0, 1e-3));
  // Top-1 of plain scores sends every token to expert 0; sinkhorn spreads them.
  auto r = moe::sinkhorn_routing(cost, 1, /*training=*/true);
  EXPECT_EQ(r.map.sum(0)[1].item<int64_t>(), 2);
  EXPECT_TRUE(torch::allclose(r.probs, torch::sigmoid(cost) * r.map));
  // Evaluation routes on the activation.
  EXPECT_EQ(moe::sinkhorn_routing(cost, 1, false).map.sum(0)[0].item<int64_t>(), 4);
}

TEST(MoeRouting, CapacityDropsByProbsOrByPosition) {
  const auto routed = moe::topk_routing(example_logits(), options(MoeScoreFunction::kSoftmax));
  EXPECT_EQ(moe::expert_capacity(4, 2, 4, 0.5), 1);
  EXPECT_EQ(moe::expert_capacity(4, 2, 4, 1.0), 2);
  // Factor 1: every expert has exactly 2 tokens here: nothing dropped.
  const auto same = moe::apply_capacity(routed, 2, 1.0, MoeDropPolicy::kProbs, false);
  EXPECT_TRUE(torch::equal(same.map, routed.map));
  // Factor 0.5: capacity 1. By probs: e0 keeps t0 (0.731 > 0.378), e1 t3, e2 t1, e3 t3.
  const auto probs = moe::apply_capacity(routed, 2, 0.5, MoeDropPolicy::kProbs, false);
  auto want = torch::zeros({4, 4}, torch::kBool);
  want[0][0] = true;
  want[3][1] = true;
  want[1][2] = true;
  want[3][3] = true;
  EXPECT_TRUE(torch::equal(probs.map, want)) << probs.map;
  EXPECT_TRUE(torch::equal(probs.probs, routed.probs * want));  // kept probs are not renormalised
  // By position: the earliest routed token: e0 t0, e1 t0, e2 t1, e3 t1.
  const auto position = moe::apply_capacity(routed, 2, 0.5, MoeDropPolicy::kPosition, false);
  auto want_position = torch::zeros({4, 4}, torch::kBool);
  want_position[0][0] = true;
  want_position[0][1] = true;
  want_position[1][2] = true;
  want_position[1][3] = true;
  EXPECT_TRUE(torch::equal(position.map, want_position)) << position.map;
}

TEST(MoeRouting, PadToCapacityGivesEveryExpertExactlyCapacityTokens) {
  // Skewed routing: everything goes to experts 0 and 1.
  auto logits = torch::tensor({{3.0, 2.0, 0.0, 0.0}, {3.0, 2.0, 0.0, 0.0}, {3.0, 2.0, 0.0, 0.0}, {3.0, 2.0, 0.0, 0.0}},
                              torch::kFloat64);
  const auto routed = moe::topk_routing(logits, options(MoeScoreFunction::kSoftmax));
  for (auto policy : {MoeDropPolicy::kProbs, MoeDropPolicy::kPosition}) {
    const auto padded = moe::apply_capacity(routed, 2, 1.0, policy, true);
    EXPECT_TRUE(torch::equal(padded.map.sum(0), torch::full({4}, 2, torch::kInt64))) << padded.map;
    // Experts 2 and 3 get the earliest unrouted tokens with prob 0; 0 and 1 their first tokens.
    EXPECT_TRUE(padded.map[0][2].item<bool>() && padded.map[1][2].item<bool>());
    EXPECT_EQ(padded.probs.select(1, 2).abs().sum().item<double>(), 0.0);
    EXPECT_TRUE(padded.map[0][0].item<bool>() && padded.map[1][0].item<bool>());
  }
}

TEST(MoeRouting, RoutingMapPaddingForFp8UsesTheEarliestUnroutedTokens) {
  // 20 tokens, 2 experts: expert 0 gets tokens 0..4, expert 1 tokens 5..19.
  auto map = torch::zeros({20, 2}, torch::kBool);
  map.narrow(0, 0, 5).select(1, 0).fill_(true);
  map.narrow(0, 5, 15).select(1, 1).fill_(true);
  auto padded = moe::pad_routing_map(map, 16);
  EXPECT_EQ(padded.select(1, 0).sum().item<int64_t>(), 16);
  EXPECT_EQ(padded.select(1, 1).sum().item<int64_t>(), 16);
  // Expert 0's 11 extra tokens are 5..15, expert 1's one extra is token 0.
  EXPECT_TRUE(padded.narrow(0, 0, 16).select(1, 0).all().item<bool>());
  EXPECT_FALSE(padded[16][0].item<bool>());
  EXPECT_TRUE(padded[0][1].item<bool>());
  EXPECT_FALSE(padded[1][1].item<bool>());
  // Already aligned: unchanged.
  EXPECT_TRUE(torch::equal(moe::pad_routing_map(padded, 16), padded));
}

TEST(MoeRouting, InputJitterStaysInItsRangeAndKeepsTheGradient) {
  torch::manual_seed(9);
  auto x = torch::full({64, 16}, 2.0, torch::kFloat64).requires_grad_(true);
  auto y = moe::input_jitter(x, 0.01);
  EXPECT_GE(y.min().item<double>(), 2.0 * 0.99);
  EXPECT_LE(y.max().item<double>(), 2.0 * 1.01);
  EXPECT_GT(y.std().item<double>(), 0.0);
  y.sum().backward();
  EXPECT_TRUE(torch::allclose(x.grad(), y.detach() / 2.0));  // d(x u)/dx = u
}

TEST(MoeAuxLoss, UnscaledLossIsOneAtPerfectBalance) {
  // The example's aux top-2 (full softmax): {0,1}, {2,3}, {0,2}, {1,3}: counts [2, 2, 2, 2].
  const auto aux = moe::aux_loss_scores(example_logits(), 2, MoeScoreFunction::kSoftmax);
  auto counts = aux.map.sum(0).to(torch::kFloat64);
  EXPECT_TRUE(torch::equal(counts, torch::full({4}, 2.0, torch::kFloat64)));
  auto loss = moe::switch_load_balancing_loss(aux.scores, counts, 4, 2, 4, 1.0);
  EXPECT_NEAR(loss.item<double>(), 1.0, 1e-6);
  // With a coefficient the loss is the coefficient.
  EXPECT_NEAR(moe::switch_load_balancing_loss(aux.scores, counts, 4, 2, 4, 0.01).item<double>(), 0.01, 1e-8);
  // Normalised sigmoid scores sum to one per token as well.
  const auto sig = moe::aux_loss_scores(example_logits(), 2, MoeScoreFunction::kSigmoid);
  auto uniform = torch::full({4}, 2.0);
  EXPECT_NEAR(moe::switch_load_balancing_loss(sig.scores, uniform, 4, 2, 4, 1.0).item<double>(), 1.0, 1e-6);
}

TEST(MoeAuxLoss, UnbalancedRoutingScoresAboveOne) {
  // Every token picks {0, 1} with scores (0.4, 0.4, 0.1, 0.1): counts [4, 4, 0, 0] -> 1.6.
  auto scores = torch::tensor({0.4, 0.4, 0.1, 0.1}, torch::kFloat64).repeat({4, 1});
  auto counts = torch::tensor({4.0, 4.0, 0.0, 0.0}, torch::kFloat64);
  EXPECT_NEAR(moe::switch_load_balancing_loss(scores, counts, 4, 2, 4, 1.0).item<double>(), 1.6, 1e-12);
  // Split over two "tensor-parallel ranks" (tokens {0,1} and {2,3}) with the scope's counts and
  // total, the partial losses add up to the whole.
  auto a = moe::switch_load_balancing_loss(scores.narrow(0, 0, 2), counts, 4, 2, 4, 1.0);
  auto b = moe::switch_load_balancing_loss(scores.narrow(0, 2, 2), counts, 4, 2, 4, 1.0);
  EXPECT_NEAR((a + b).item<double>(), 1.6, 1e-12);
}

TEST(MoeAuxLoss, ZLossOfTheExample) {
  EXPECT_NEAR(moe::z_loss(example_logits(), 1.0).item<double>(), 7.544889, 1e-5);
  EXPECT_NEAR(moe::z_loss(example_logits(), 1e-3).item<double>(), 7.544889e-3, 1e-8);
}

ModelConfig router_model(std::initializer_list<std::string> extra) {
  auto args = testing::tiny_args({"--num-experts", "4", "--attention-dropout", "0", "--hidden-dropout", "0"});
  args.insert(args.end(), extra.begin(), extra.end());
  return testing::build(args).model;
}

std::shared_ptr<MoeContext> context_for(const ModelConfig& m) {
  return std::make_shared<MoeContext>(m.moe, m.num_layers, ExpertParallelGroups::single_process());
}

ModuleFactory plain_factory(uint64_t seed) {
  TensorParallelContext tp{make_self_communicator("tp", 0), 0, 1, false};
  return ModuleFactory(seed, tp);
}

// The gradient the auxiliary losses put on the router weight equals scale x d(aux)/dW, computed
// by autograd on the explicit sum probs.R + scale * (aux + seq aux + z-loss).
TEST(MoeAuxLoss, AutoscalerSeedsTheLossesWithTheContextScale) {
  const auto m = router_model({"--moe-router-load-balancing-type", "aux_loss", "seq_aux_loss", "--moe-aux-loss-coeff", "0.3",
                               "0.2", "--moe-z-loss-coeff", "0.1", "--disable-bias-linear"});
  auto context = context_for(m);
  context->set_aux_grad_scale(0.25);
  TopKRouter router(m, "decoder.layers.0.mlp.router", 0, plain_factory(7), context);
  router->train();
  torch::manual_seed(11);
  const int64_t s = 4, b = 2, h = m.hidden_size;
  auto x = torch::randn({s, b, h});
  auto weights_r = torch::randn({s * b, 4});
  auto r = router(x);
  (r.probs * weights_r).sum().backward();
  const auto got = router->weight.grad().clone();

  auto w = router->weight.detach().clone().requires_grad_(true);
  auto logits = torch::mm(x.reshape({s * b, h}), w.t());
  auto ref = moe::topk_routing(logits, moe::TopKOptions::from(m.moe));
  const auto aux = moe::aux_loss_scores(logits, 2, MoeScoreFunction::kSoftmax);
  auto counts = aux.map.sum(0).to(torch::kFloat32);
  auto balance = moe::switch_load_balancing_loss(aux.scores, counts, double(s * b), 2, 4, 0.3);
  auto seq_scores = aux.scores.reshape({s, b * 4});
  auto seq_counts = aux.map.reshape({s, b * 4}).sum(0).to(torch::kFloat32);
  auto seq = moe::switch_load_balancing_loss(seq_scores, seq_counts, double(s), 2, 4, 0.2) / double(b);
  auto z = moe::z_loss(logits, 0.1);
  ((ref.probs * weights_r).sum() + 0.25 * (balance + seq + z)).backward();
  EXPECT_TRUE(torch::allclose(got, w.grad(), 1e-5, 1e-7)) << got << w.grad();
  // The aux losses are recorded unscaled (divided by their coefficients).
  EXPECT_NEAR(context->metrics()["load_balancing_loss"].values[0].item<double>(), balance.item<double>() / 0.3, 1e-5);
  EXPECT_NEAR(context->metrics()["z_loss"].values[0].item<double>(), z.item<double>() / 0.1, 1e-4);
}

// global_aux_loss: the counts of the step's micro-batches so far, averaged; restarted by end_step.
TEST(MoeAuxLoss, GlobalAuxLossAveragesTheCountsOverTheStepsMicroBatches) {
  const auto m = router_model({"--moe-router-load-balancing-type", "global_aux_loss", "--moe-aux-loss-coeff", "0.5",
                               "--disable-bias-linear"});
  auto context = context_for(m);
  TopKRouter router(m, "decoder.layers.0.mlp.router", 0, plain_factory(7), context);
  router->train();
  torch::manual_seed(12);
  auto x1 = torch::randn({4, 2, m.hidden_size}), x2 = torch::randn({4, 2, m.hidden_size}) * 3;
  router(x1);
  router(x2);
  const auto w = router->weight.detach();
  auto aux = [&](const torch::Tensor& x) {
    return moe::aux_loss_scores(torch::mm(x.reshape({8, m.hidden_size}), w.t()), 2, MoeScoreFunction::kSoftmax);
  };
  const auto a1 = aux(x1), a2 = aux(x2);
  auto c1 = a1.map.sum(0).to(torch::kFloat32), c2 = a2.map.sum(0).to(torch::kFloat32);
  const double l1 = moe::switch_load_balancing_loss(a1.scores, c1, 8, 2, 4, 1.0).item<double>();
  const double l2 = moe::switch_load_balancing_loss(a2.scores, (c1 + c2) / 2, 8, 2, 4, 1.0).item<double>();
  EXPECT_NEAR(context->metrics()["global_load_balancing_loss"].values[0].item<double>(), l1 + l2, 1e-5);
  // A new step starts from its own first micro-batch.
  context->end_step();
  context->metrics()["global_load_balancing_loss"].values.zero_();
  router(x2);
  const double fresh = moe::switch_load_balancing_loss(a2.scores, c2, 8, 2, 4, 1.0).item<double>();
  EXPECT_NEAR(context->metrics()["global_load_balancing_loss"].values[0].item<double>(), fresh, 1e-5);
}

// --moe-router-force-load-balancing: the routing comes from the default generator, not from the
// router's weights (two different routers route the same with the same seed), loads are even to
// sampling noise, and the router's weight still gets the gradient of the real logits.
TEST(MoeRouter, ForceLoadBalancingRoutesOnRandomLogitsAndKeepsTheGradient) {
  const auto m = router_model({"--moe-router-force-load-balancing", "--moe-aux-loss-coeff", "0"});
  ASSERT_TRUE(m.moe.force_load_balancing);
  auto context = context_for(m);
  TopKRouter a(m, "decoder.layers.0.mlp.router", 0, plain_factory(7), context);
  TopKRouter b(m, "decoder.layers.1.mlp.router", 1, plain_factory(8), context);
  ASSERT_FALSE(torch::equal(a->weight, b->weight));
  a->train();
  b->train();
  torch::manual_seed(5);
  auto x = torch::randn({512, 4, m.hidden_size}).requires_grad_(true);
  torch::manual_seed(11);
  auto ra = a(x);
  torch::manual_seed(11);
  auto rb = b(x.detach());
  EXPECT_TRUE(torch::equal(ra.map, rb.map));
  EXPECT_TRUE(torch::equal(ra.probs.detach(), rb.probs.detach()));
  // 2048 tokens x top-k over 4 experts: each expert's share is 1/4 within sampling noise.
  const auto share = ra.map.sum(0).to(torch::kFloat64) / ra.map.sum().to(torch::kFloat64);
  EXPECT_LT((share - 0.25).abs().max().item<double>(), 0.03) << share;
  // The gradient goes straight through to the gating GEMM: d(sum probs * c)/dW is nonzero.
  (ra.probs * torch::arange(4, ra.probs.options()).unsqueeze(0)).sum().backward();
  ASSERT_TRUE(a->weight.grad().defined());
  EXPECT_GT(a->weight.grad().abs().sum().item<double>(), 0.0);
  EXPECT_GT(x.grad().abs().sum().item<double>(), 0.0);
}

TEST(MoeRouter, ExpertBiasMovesTowardsTheMeanCount) {
  const auto m = router_model({"--moe-router-score-function", "sigmoid", "--moe-router-enable-expert-bias",
                               "--moe-router-bias-update-rate", "1e-3"});
  auto context = context_for(m);
  TopKRouter router(m, "decoder.layers.0.mlp.router", 0, plain_factory(7), context);
  ASSERT_TRUE(router->expert_bias.defined());
  EXPECT_EQ(router->expert_bias.scalar_type(), torch::kFloat32);
  // Counts [3, 1, 2, 2]: mean 2 -> expert 0 down, expert 1 up, the others unchanged (sign(0) = 0).
  router->update_expert_bias(torch::tensor({3.0f, 1.0f, 2.0f, 2.0f}));
  EXPECT_TRUE(torch::allclose(router->expert_bias, torch::tensor({-1e-3f, 1e-3f, 0.0f, 0.0f})));
  // The counts of a step are the routed tokens of every forward with gradients; end_step folds
  // them in (one all-reduce, here of one rank) and restarts them.
  router->train();
  auto x = torch::randn({4, 2, m.hidden_size});
  auto r = router(x);
  auto counts = r.map.sum(0).to(torch::kFloat32);
  EXPECT_TRUE(torch::equal(router->local_tokens_per_expert(), counts));
  {
    torch::NoGradGuard no_grad;  // evaluation does not count
    router(x);
  }
  EXPECT_TRUE(torch::equal(router->local_tokens_per_expert(), counts));
  const auto before = router->expert_bias.clone();
  context->end_step();
  auto mean = counts.sum() / 4;
  EXPECT_TRUE(torch::allclose(router->expert_bias, before + torch::sign(mean - counts) * 1e-3));
  EXPECT_EQ(router->local_tokens_per_expert().abs().sum().item<float>(), 0.0f);
}

TEST(MoeContext, TrackedMetricNamesFollowMegatronsSubstringTest) {
  auto names = [](std::initializer_list<std::string> flags) {
    return MoeContext(router_model(flags).moe, 2, ExpertParallelGroups::single_process()).tracked_metric_names();
  };
  EXPECT_EQ(names({}), (std::vector<std::string>{"load_balancing_loss"}));
  // One type given as a string: "aux_loss" is a substring of "seq_aux_loss".
  EXPECT_EQ(names({"--moe-router-load-balancing-type", "seq_aux_loss"}),
            (std::vector<std::string>{"load_balancing_loss", "seq_load_balancing_loss"}));
  EXPECT_EQ(names({"--moe-router-load-balancing-type", "global_aux_loss", "--moe-z-loss-coeff", "1e-3"}),
            (std::vector<std::string>{"load_balancing_loss", "global_load_balancing_loss", "z_loss"}));
  // A list: exact membership.
  EXPECT_EQ(names({"--moe-router-load-balancing-type", "seq_aux_loss", "global_aux_loss", "--moe-aux-loss-coeff", "1", "2"}),
            (std::vector<std::string>{"seq_load_balancing_loss", "global_load_balancing_loss"}));
  EXPECT_TRUE(names({"--moe-router-load-balancing-type", "none"}).empty());
}

}  // namespace
}  // namespace fp8tron
