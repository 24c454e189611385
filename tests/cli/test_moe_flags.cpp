// The MoE flags: --moe-layer-freq's pattern language, Megatron's rewrites and the named validation
// rules, the MoE parameter count and FLOPs of the reference configurations (docs/moe.md), the
// dry-run's MoE layout and the iteration line's MoE losses.
#include <gtest/gtest.h>

#include "tests/test_helpers.h"
#include "trainer/cli/dry_run.h"
#include "trainer/cli/model_math.h"
#include "trainer/cli/moe_layer_freq.h"
#include "trainer/logging/iteration_log.h"

namespace fp8tron {
namespace {
using namespace fp8tron::testing;

std::vector<bool> bits(const std::string& s) {
  std::vector<bool> out;
  for (char c : s) out.push_back(c == '1');
  return out;
}

TEST(MoeLayerFreq, IntsAndPythonListPatterns) {
  EXPECT_EQ(parse_moe_layer_freq("1", 4), bits("1111"));
  EXPECT_EQ(parse_moe_layer_freq("2", 5), bits("10101"));
  EXPECT_EQ(parse_moe_layer_freq("([0]*1+[1]*3)*2", 8), bits("01110111"));
  EXPECT_EQ(parse_moe_layer_freq("([1]*3+[0]*2)*2", 10), bits("1110011100"));
  EXPECT_EQ(parse_moe_layer_freq("([0]+[1]*23)", 24), bits("0" + std::string(23, '1')));
  // Python semantics: int arithmetic inside, int * list, trailing commas, powers.
  EXPECT_EQ(parse_moe_layer_freq("[1+0,0,]", 2), bits("10"));
  EXPECT_EQ(parse_moe_layer_freq("2*[0,1]", 4), bits("0101"));
  EXPECT_EQ(parse_moe_layer_freq("[1]*2**2", 4), bits("1111"));
}

TEST(MoeLayerFreq, RefusalsNameTheFlag) {
  EXPECT_USER_ERROR(parse_moe_layer_freq("[1, 1]", 2), "invalid pattern");                   // a space
  EXPECT_USER_ERROR(parse_moe_layer_freq("[1]*-1", 2), "invalid pattern");                   // a minus
  EXPECT_USER_ERROR(parse_moe_layer_freq("([1],[1])", 2), "tuple");
  EXPECT_USER_ERROR(parse_moe_layer_freq("[1]*3", 2), "the pattern has 3 entries but --num-layers is 2");
  EXPECT_USER_ERROR(parse_moe_layer_freq("[1,2]", 2), "flat list of 0");
  EXPECT_USER_ERROR(parse_moe_layer_freq("[[1],[0]]", 2), "flat list of 0");
  EXPECT_USER_ERROR(parse_moe_layer_freq("[1]+1", 2), "+ of a list and an int");
  EXPECT_USER_ERROR(parse_moe_layer_freq("[1]*[1]", 2), "* of two lists");
  EXPECT_USER_ERROR(parse_moe_layer_freq("[01]", 1), "leading zeros");
  EXPECT_USER_ERROR(parse_moe_layer_freq("0", 2), "at least 1");
  EXPECT_USER_ERROR(parse_moe_layer_freq("abc", 2), "--moe-layer-freq 'abc'");
}

std::vector<std::string> moe(std::initializer_list<std::string> extra) {
  std::vector<std::string> a = tiny_args({"--num-experts", "4"});
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

TEST(MoeConfig, MegatronDefaultsAndRewrites) {
  Config c = build(moe({}));
  const MoeConfig& m = c.model.moe;
  EXPECT_TRUE(m.enabled());
  EXPECT_EQ(m.topk, 2);
  EXPECT_EQ(m.ffn_hidden_size, c.model.ffn_hidden_size);  // defaults to --ffn-hidden-size, with a warning
  EXPECT_EQ(m.dispatcher, MoeDispatcher::kAllGather);
  EXPECT_EQ(m.balancing.size(), 1u);
  EXPECT_EQ(m.balancing[0].type, MoeBalancing::kAuxLoss);
  EXPECT_EQ(m.balancing[0].coeff, 0.0);
  EXPECT_EQ(m.layer_pattern, bits("11"));
  EXPECT_TRUE(c.not_supported_yet.empty());
  bool warned = false;
  for (const auto& w : c.hint_warnings) warned = warned || w.find("--moe-ffn-hidden-size is not set") != std::string::npos;
  EXPECT_TRUE(warned);
  // --num-experts 0 is a dense model; a negative capacity factor is dropless; the fp8 alias.
  EXPECT_FALSE(build(tiny_args({"--num-experts", "0"})).model.moe.enabled());
  EXPECT_FALSE(build(moe({"--moe-expert-capacity-factor", "-1"})).model.moe.capacity_factor.has_value());
  EXPECT_TRUE(build(moe({"--moe-router-padding-for-fp8", "--fp8-format", "hybrid", "--moe-token-dispatcher-type", "alltoall"}))
                  .model.moe.router_padding_for_quantization);
  // Several balancing types pair with their coefficients.
  Config two = build(moe({"--moe-router-load-balancing-type", "seq_aux_loss", "global_aux_loss", "--moe-aux-loss-coeff",
                          "1e-4", "1e-3"}));
  ASSERT_EQ(two.model.moe.balancing.size(), 2u);
  EXPECT_TRUE(two.model.moe.balancing_is_list);
  EXPECT_EQ(two.model.moe.balancing[1].type, MoeBalancing::kGlobalAuxLoss);
  EXPECT_EQ(two.model.moe.balancing[1].coeff, 1e-3);
  // --no-use-gmm-fp8 reaches the experts.
  EXPECT_FALSE(build(moe({"--fp8-format", "hybrid", "--no-use-gmm-fp8"})).model.moe.expert_gemm_fp8);
}

TEST(MoeConfig, ValidationRulesNameTheFlags) {
  EXPECT_USER_ERROR(build(tiny_args({"--num-experts", "-2"})), "--num-experts must not be negative");
  EXPECT_USER_ERROR(build(tiny_args({"--moe-ffn-hidden-size", "64"})), "--moe-ffn-hidden-size needs --num-experts");
  EXPECT_USER_ERROR(build(moe({"--moe-token-dispatcher-type", "flex"})), "--moe-token-dispatcher-type flex");
  EXPECT_USER_ERROR(build(moe({"--moe-router-load-balancing-type", "quantile_balancing"})), "quantile_balancing is not supported");
  EXPECT_USER_ERROR(build(moe({"--moe-router-load-balancing-type", "aux_loss", "seq_aux_loss", "--moe-aux-loss-coeff", "1"})),
                    "one coefficient per --moe-router-load-balancing-type");
  EXPECT_USER_ERROR(build(moe({"--moe-router-topk", "1"})), "needs --moe-router-pre-softmax");
  EXPECT_NO_THROW(build(moe({"--moe-router-topk", "1", "--moe-router-pre-softmax"})));
  EXPECT_USER_ERROR(build(moe({"--moe-router-enable-expert-bias"})), "sigmoid or sqrtsoftplus");
  EXPECT_USER_ERROR(build(moe({"--moe-router-group-topk", "2"})), "needs --moe-router-num-groups");
  EXPECT_USER_ERROR(build(moe({"--moe-router-num-groups", "3", "--moe-router-group-topk", "1"})),
                    "--num-experts (4) is not divisible by --moe-router-num-groups (3)");
  EXPECT_USER_ERROR(build(moe({"--moe-router-num-groups", "2", "--moe-router-group-topk", "3"})),
                    "must be between 1 and --moe-router-num-groups");
  EXPECT_USER_ERROR(build(moe({"--moe-router-load-balancing-type", "sinkhorn", "--moe-aux-loss-coeff", "0.1"})),
                    "sinkhorn needs --moe-aux-loss-coeff 0");
  EXPECT_USER_ERROR(build(moe({"--moe-router-load-balancing-type", "sinkhorn", "--moe-expert-capacity-factor", "1"})),
                    "--moe-expert-capacity-factor only works with");
  EXPECT_USER_ERROR(build(moe({"--moe-pad-expert-input-to-capacity"})), "needs --moe-expert-capacity-factor");
  EXPECT_USER_ERROR(build(moe({"--moe-shared-expert-intermediate-size", "0"})), "must be positive");
  EXPECT_USER_ERROR(build(moe({"--moe-shared-expert-intermediate-size", "32"})), "needs --disable-bias-linear");
  EXPECT_USER_ERROR(build(moe({"--moe-shared-expert-intermediate-size", "32", "--disable-bias-linear",
                               "--moe-shared-expert-overlap"})),
                    "--moe-shared-expert-overlap only works with --moe-token-dispatcher-type alltoall");
  EXPECT_USER_ERROR(build(moe({"--moe-router-padding-for-fp8", "--moe-token-dispatcher-type", "alltoall"})), "needs FP8");
  EXPECT_USER_ERROR(build(moe({"--moe-router-padding-for-fp8", "--fp8-format", "hybrid"})), "not supported by the allgather");
  EXPECT_USER_ERROR(build(moe({"--moe-router-topk", "5"})), "must be between 1 and --num-experts");
  EXPECT_USER_ERROR(build(moe({"--moe-layer-freq", "([0]*2)"})), "selects no layer");
  EXPECT_USER_ERROR(build(moe({"--tensor-model-parallel-size", "2", "--global-batch-size", "2"}), 2),
                    "needs --sequence-parallel");
  EXPECT_USER_ERROR(build(moe({"--tensor-model-parallel-size", "2", "--sequence-parallel", "--global-batch-size", "2"}), 2),
                    "expert biases (no --disable-bias-linear) need --expert-tensor-parallel-size 1");
  EXPECT_USER_ERROR(build(moe({"--moe-ffn-hidden-size", "33", "--tensor-model-parallel-size", "2", "--sequence-parallel",
                               "--disable-bias-linear", "--global-batch-size", "2"}),
                          2),
                    "--moe-ffn-hidden-size (33) is not divisible by --expert-tensor-parallel-size (2)");
  // A valid expert-parallel layout with expert tensor parallelism.
  Config ok = build(moe({"--expert-model-parallel-size", "2", "--tensor-model-parallel-size", "2", "--sequence-parallel",
                         "--disable-bias-linear", "--global-batch-size", "4"}),
                    4);
  EXPECT_EQ(ok.parallel.etp, 2);
  EXPECT_EQ(ok.parallel.edp, 1);
}

// --moe-dispatch-fp8 (fp8tron's own, off by default): accepted with the alltoall dispatcher and FP8
// experts of a per-block recipe (with expert parallelism, expert TP, the routing map padded for
// FP8, the distributed optimizer and the expert-parallel overlap too); every other combination
// refused in one line naming the flag and what to change.
TEST(MoeConfig, DispatchFp8RulesNameTheFlag) {
  auto flags = [](const std::string& recipe, const std::string& format) {
    return std::vector<std::string>{"--moe-token-dispatcher-type", "alltoall", "--fp8-format", format, "--fp8-recipe",
                                    recipe, "--moe-dispatch-fp8"};
  };
  auto args = [&](std::initializer_list<std::string> extra) { return with(with(moe({}), flags("blockwise", "e4m3")), extra); };
  EXPECT_FALSE(build(moe({})).model.moe.dispatch_fp8);
  EXPECT_TRUE(build(args({})).model.moe.dispatch_fp8);
  EXPECT_TRUE(build(with(moe({}), flags("mxfp8", "e4m3"))).model.moe.dispatch_fp8);
  EXPECT_TRUE(build(with(moe({}), flags("mxfp8", "hybrid"))).model.moe.dispatch_fp8);
  EXPECT_NO_THROW(build(args({"--expert-model-parallel-size", "2", "--global-batch-size", "4"}), 2));
  EXPECT_NO_THROW(build(args({"--expert-model-parallel-size", "2", "--tensor-model-parallel-size", "2", "--sequence-parallel",
                              "--disable-bias-linear", "--global-batch-size", "4"}),
                        4));
  EXPECT_NO_THROW(build(args({"--moe-router-padding-for-quantization"})));
  EXPECT_NO_THROW(build(args({"--expert-model-parallel-size", "2", "--use-distributed-optimizer", "--global-batch-size", "8"}), 4));
  EXPECT_NO_THROW(build(args({"--expert-model-parallel-size", "2", "--bf16", "--overlap-moe-expert-parallel-comm",
                              "--global-batch-size", "4"}),
                        2));
  EXPECT_USER_ERROR(build(tiny_args({"--moe-dispatch-fp8"})),
                    "--moe-dispatch-fp8 needs a mixture-of-experts model (--num-experts)");
  EXPECT_USER_ERROR(build(moe({"--fp8-format", "e4m3", "--fp8-recipe", "blockwise", "--moe-dispatch-fp8"})),
                    "--moe-dispatch-fp8 needs --moe-token-dispatcher-type alltoall");
  EXPECT_USER_ERROR(build(moe({"--moe-token-dispatcher-type", "alltoall", "--moe-dispatch-fp8"})),
                    "--moe-dispatch-fp8 needs FP8 experts: add --fp8-format with --fp8-recipe blockwise or mxfp8");
  EXPECT_USER_ERROR(build(args({"--no-use-gmm-fp8"})), "--moe-dispatch-fp8 needs FP8 experts: drop --no-use-gmm-fp8");
  EXPECT_USER_ERROR(build(with(moe({}), flags("delayed", "hybrid"))),
                    "--moe-dispatch-fp8 supports the per-block recipes, --fp8-recipe blockwise or mxfp8, not delayed");
  EXPECT_USER_ERROR(build(with(moe({}), flags("tensorwise", "hybrid"))),
                    "--moe-dispatch-fp8 supports the per-block recipes, --fp8-recipe blockwise or mxfp8, not tensorwise");
  EXPECT_USER_ERROR(build(with(moe({}), flags("tensorwise", "hif8"))), "--moe-dispatch-fp8 supports the per-block recipes");
  EXPECT_USER_ERROR(build(args({"--log-fp8-stats-to-tensorboard", "--tensorboard-dir", "/tmp/fp8tron-unused"})),
                    "--moe-dispatch-fp8 with --log-fp8-stats-to-tensorboard is not supported");
}

ModelConfig reference_moe(const std::vector<std::string>& extra) {
  std::vector<std::string> a = {"--seq-length", "2048", "--max-position-embeddings", "2048", "--position-embedding-type",
                                "rope", "--normalization", "RMSNorm", "--swiglu", "--disable-bias-linear",
                                "--untie-embeddings-and-output-weights", "--vocab-size", "31999", "--micro-batch-size", "1",
                                "--lr", "1e-4", "--train-iters", "1", "--builtin-data"};
  a.insert(a.end(), extra.begin(), extra.end());
  return build(a).model;
}

// docs/moe.md: the Mixtral-style and DeepSeek-style configurations (V = 32000).
TEST(MoeModelMath, ReferenceConfigurations) {
  const auto mixtral = reference_moe({"--num-layers", "16", "--hidden-size", "2048", "--num-attention-heads", "32",
                                      "--group-query-attention", "--num-query-groups", "8", "--ffn-hidden-size", "5632",
                                      "--num-experts", "8", "--moe-router-topk", "2"});
  ASSERT_EQ(mixtral.padded_vocab_size, 32000);
  const auto p = count_parameters(mixtral);
  EXPECT_EQ(p.total, 4728358912);
  EXPECT_EQ(p.active, 1406470144);
  EXPECT_NEAR(training_flops_per_token(mixtral) / 1e9, 8.44628, 1e-5);
  const auto deepseek = reference_moe({"--num-layers", "8", "--hidden-size", "2048", "--num-attention-heads", "16",
                                       "--ffn-hidden-size", "10944", "--num-experts", "64", "--moe-ffn-hidden-size", "1408",
                                       "--moe-router-topk", "6", "--moe-layer-freq", "([0]*1+[1]*7)",
                                       "--moe-shared-expert-intermediate-size", "2816"});
  const auto d = count_parameters(deepseek);
  EXPECT_EQ(d.moe_layers, 7);
  EXPECT_EQ(d.total, 4330129408);
  EXPECT_EQ(d.active, 817924096);
  EXPECT_NEAR(training_flops_per_token(deepseek) / 1e9, 4.70994, 1e-5);
}

TEST(MoeDryRun, ShowsTheLayout) {
  const Config c = build(moe({"--moe-layer-freq", "([0]+[1])", "--expert-model-parallel-size", "2", "--global-batch-size", "4",
                              "--moe-token-dispatcher-type", "alltoall"}),
                         2);
  const std::string plan = format_plan(c);
  EXPECT_NE(plan.find("mixture of experts: 1 MoE layers of 2 (pattern 01), 4 experts"), std::string::npos) << plan;
  EXPECT_NE(plan.find("2 per expert-parallel rank (EP 2)"), std::string::npos) << plan;
  EXPECT_NE(plan.find("alltoall dispatcher"), std::string::npos) << plan;
  EXPECT_NE(plan.find("active per token"), std::string::npos) << plan;
}

TEST(MoeIterationLine, LossesFollowTheLmLossInMegatronsFormat) {
  IterationStats s;
  s.lm_loss = 2.5;
  s.moe_losses = {{"load_balancing_loss", 1.0}, {"seq_load_balancing_loss", 0.0}, {"z_loss", 7.544889}};
  const std::string line = format_iteration_line(s);
  EXPECT_NE(line.find(" lm loss: 2.500000E+00 | load_balancing_loss: 1.000000E+00 | seq_load_balancing_loss: "
                      "0.000000E+00 | z_loss: 7.544889E+00 | loss scale:"),
            std::string::npos)
      << line;
}

}  // namespace
}  // namespace fp8tron
