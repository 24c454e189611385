// The tensor-parallel overlap flags: the --tp-comm-overlap-cfg reader (YAML subset, JSON), the
// resolved per-GEMM plan (TE's defaults, the file, Megatron's switches, MindSpeed's MC2/CoC), the
// validation rules and their messages, and the pipeline p2p flags.
#include <gtest/gtest.h>

#include <map>

#include "core/error.h"
#include "tests/test_helpers.h"
#include "trainer/cli/tp_overlap_args.h"
#include "trainer/cli/tp_overlap_cfg.h"

namespace fp8tron {
using namespace fp8tron::testing;
using M = OverlapMethod;
using G = TpGemm;

namespace {
// TP2 with sequence parallelism (two ranks), plus `extra`.
Config tp2(std::initializer_list<std::string> extra) {
  std::vector<std::string> a = tiny_args({"--tensor-model-parallel-size", "2", "--sequence-parallel"});
  a.insert(a.end(), extra.begin(), extra.end());
  return build(a, 2);
}
M method(const Config& c, G g) { return c.distributed.tp_overlap.gemm(g).method; }
}  // namespace

// Paraphrase of Megatron's functional test tp_comm_overlap_cfg.yaml, with YAML 1.1 spellings.
TEST(TpOverlapCfg, ReadsTheYamlSubset) {
  const UbCfgFile f = parse_ub_cfg_yaml(
      "# userbuffer config\n"
      "qkv_fprop:\n"
      "  method: ring_exchange\n"
      "  aggregate: 1   # pairs first\n"
      "proj_fprop:\n"
      "  method: 'pipeline'\n"
      "  num_sm: 4\n"
      "  num_splits: 4\n"
      "  set_sm_margin: False\n"
      "\n"
      "fc2_fprop:\n"
      "    method: \"ring_exchange\"\n",
      "cfg.yaml");
  ASSERT_EQ(f.entries.size(), 3u);
  EXPECT_EQ(f.entries[0].gemm, "qkv_fprop");
  EXPECT_EQ(f.entries[0].fields[1].key, "aggregate");
  EXPECT_EQ(f.entries[0].fields[1].value, "1");
  EXPECT_EQ(f.entries[1].fields[0].value, "pipeline");
  EXPECT_EQ(f.entries[1].fields[3].line, 9);
  EXPECT_EQ(f.entries[2].fields[0].value, "ring_exchange");
  bool b = true;
  EXPECT_TRUE(parse_yaml_bool("False", &b) && !b);
  EXPECT_TRUE(parse_yaml_bool("YES", &b) && b);
  EXPECT_FALSE(parse_yaml_bool("y", &b)) << "PyYAML reads 'y' as a string";
  EXPECT_FALSE(parse_yaml_bool("tRUE", &b));
  long long i = 0;
  EXPECT_TRUE(parse_yaml_int("1_000", &i) && i == 1000);
  EXPECT_FALSE(parse_yaml_int("4.0", &i));
}

TEST(TpOverlapCfg, RefusesWhatIsNotTheSubsetWithFileAndLine) {
  EXPECT_USER_ERROR(parse_ub_cfg_yaml("qkv_fprop:\n\tmethod: bulk\n", "a.yaml"), "a.yaml:2: tabs");
  EXPECT_USER_ERROR(parse_ub_cfg_yaml("qkv_fprop:\n  method: [bulk]\n", "a.yaml"), "a.yaml:2: '[bulk]' is not a plain scalar");
  EXPECT_USER_ERROR(parse_ub_cfg_yaml("qkv_fprop:\n  method:\n    x: 1\n", "a.yaml"), "a.yaml:2: a field needs a value");
  EXPECT_USER_ERROR(parse_ub_cfg_yaml("qkv_fprop: {method: bulk}\n", "a.yaml"), "a.yaml:1: 'qkv_fprop' must be a GEMM name");
  EXPECT_USER_ERROR(parse_ub_cfg_yaml("qkv_fprop:\nproj_fprop:\n  method: pipeline\n", "a.yaml"), "a.yaml:1: 'qkv_fprop' has no fields");
  EXPECT_USER_ERROR(parse_ub_cfg_yaml("  method: bulk\n", "a.yaml"), "a.yaml:1: a field before any GEMM name");
  EXPECT_USER_ERROR(parse_ub_cfg_yaml("qkv_fprop:\n  method: a\n  method: b\n", "a.yaml"), "a.yaml:3: 'method' given twice");
  EXPECT_USER_ERROR(read_ub_cfg("/nonexistent/ub.yaml"), "cannot open");
}

TEST(TpOverlapCfg, ReadsJson) {
  const std::string path = temp_file("ub.json", R"({"proj_fprop": {"method": "pipeline", "num_splits": 2, "fp8_buf": true}})");
  const UbCfgFile f = read_ub_cfg(path);
  ASSERT_EQ(f.entries.size(), 1u);
  std::map<std::string, std::string> fields;
  for (const auto& field : f.entries[0].fields) fields[field.key] = field.value;
  EXPECT_EQ(fields["method"], "pipeline");
  EXPECT_EQ(fields["num_splits"], "2");
  EXPECT_EQ(fields["fp8_buf"], "true");
  EXPECT_USER_ERROR(read_ub_cfg(temp_file("bad.json", "[1, 2]")), "an object of GEMM names");
}

// Transformer Engine's initialize_ub defaults, as --tp-comm-overlap resolves them.
TEST(TpOverlapPlan, TransformerEngineDefaults) {
  const Config c = tp2({"--tp-comm-overlap"});
  const auto& p = c.distributed.tp_overlap;
  EXPECT_EQ(p.source, TpOverlapSource::kMegatron);
  for (G g : {G::kQkvFprop, G::kFc1Fprop, G::kProjDgrad, G::kFc2Dgrad}) {
    EXPECT_EQ(method(c, g), M::kRingExchange) << tp_gemm_name(g);
    EXPECT_EQ(p.gemm(g).num_splits, 2) << "ring exchange: one chunk per rank";
  }
  for (G g : {G::kProjFprop, G::kFc2Fprop}) {
    EXPECT_EQ(method(c, g), M::kPipeline);
    EXPECT_EQ(p.gemm(g).num_splits, 4);
    EXPECT_EQ(p.gemm(g).num_sm, 16);
    EXPECT_TRUE(p.gemm(g).sm_margin);
  }
  for (G g : {G::kQkvDgrad, G::kFc1Dgrad, G::kQkvWgrad, G::kFc1Wgrad}) EXPECT_EQ(method(c, g), M::kBulk);
  for (G g : {G::kProjWgrad, G::kFc2Wgrad}) EXPECT_EQ(method(c, g), M::kExternal);
  for (size_t i = 0; i < kNumTpGemms; ++i) EXPECT_FALSE(p.gemms[i].fp8_wire) << "no FP8 wire without --fp8-format";
  EXPECT_FALSE(p.output_layer);
  EXPECT_NE(p.describe().find("qkv_fprop ring_exchange"), std::string::npos);
}

TEST(TpOverlapPlan, Fp8WireFollowsTransformerEnginesRule) {
  const Config c = tp2({"--tp-comm-overlap", "--fp8-format", "hybrid", "--hidden-size", "64"});
  const auto& p = c.distributed.tp_overlap;
  for (G g : {G::kQkvFprop, G::kQkvDgrad, G::kProjDgrad, G::kFc1Fprop, G::kFc1Dgrad, G::kFc2Dgrad})
    EXPECT_TRUE(p.gemm(g).fp8_wire) << tp_gemm_name(g) << ": all-gathers move FP8";
  EXPECT_FALSE(p.gemm(G::kProjFprop).fp8_wire) << "a pipelined reduce-scatter moves FP8 only with fp8_buf";
  const std::string cfg = temp_file("fp8buf.yaml", "proj_fprop:\n  method: pipeline\n  num_splits: 2\n  fp8_buf: true\n"
                                                   "qkv_fprop:\n  method: ring_exchange\n  fp8_buf: false\n");
  const Config d = tp2({"--tp-comm-overlap", "--fp8-format", "hybrid", "--hidden-size", "64", "--tp-comm-overlap-cfg", cfg});
  EXPECT_TRUE(d.distributed.tp_overlap.gemm(G::kProjFprop).fp8_wire);
  EXPECT_TRUE(d.distributed.tp_overlap.gemm(G::kQkvFprop).fp8_wire) << "TE: all-gathers cannot opt out of FP8";
}

TEST(TpOverlapPlan, MegatronSwitches) {
  for (const char* spelling : {"--disable-tp-comm-overlap-ag", "--no-tp-comm-overlap-ag"}) {
    const Config c = tp2({"--tp-comm-overlap", spelling});
    for (G g : {G::kQkvFprop, G::kFc1Fprop, G::kProjDgrad, G::kFc2Dgrad, G::kProjWgrad, G::kFc2Wgrad})
      EXPECT_EQ(method(c, g), M::kOff) << spelling << " " << tp_gemm_name(g);
    EXPECT_EQ(method(c, G::kProjFprop), M::kPipeline);
  }
  const Config rs = tp2({"--tp-comm-overlap", "--disable-tp-comm-overlap-rs"});
  EXPECT_EQ(method(rs, G::kProjFprop), M::kOff);
  EXPECT_EQ(method(rs, G::kFc2Fprop), M::kOff);
  EXPECT_EQ(method(rs, G::kQkvFprop), M::kRingExchange);
  const Config bulk = tp2({"--tp-comm-overlap", "--no-tp-comm-bulk-dgrad", "--disable-tp-comm-bulk-wgrad"});
  for (G g : {G::kQkvDgrad, G::kFc1Dgrad, G::kQkvWgrad, G::kFc1Wgrad}) EXPECT_EQ(method(bulk, g), M::kOff);
  // rs-dgrad: a 4-split pipeline, and neither bulk overlap (TE).
  const Config rsd = tp2({"--tp-comm-overlap", "--tp-comm-overlap-rs-dgrad"});
  EXPECT_EQ(method(rsd, G::kQkvDgrad), M::kPipeline);
  EXPECT_EQ(rsd.distributed.tp_overlap.gemm(G::kQkvDgrad).num_splits, 4);
  EXPECT_EQ(method(rsd, G::kQkvWgrad), M::kOff);
  // fp8tron's names for Megatron's tp_comm_overlap_disable_qkv/fc1: no overlap of the all-gather
  // and no rs-dgrad in that module; its bulk overlaps stay.
  const Config dq = tp2({"--tp-comm-overlap", "--tp-comm-overlap-rs-dgrad", "--tp-comm-overlap-disable-qkv"});
  EXPECT_EQ(method(dq, G::kQkvFprop), M::kOff);
  EXPECT_EQ(method(dq, G::kQkvDgrad), M::kBulk);
  EXPECT_EQ(method(dq, G::kQkvWgrad), M::kBulk);
  EXPECT_EQ(method(dq, G::kFc1Dgrad), M::kPipeline);
  const Config df = tp2({"--tp-comm-overlap", "--tp-comm-overlap-disable-fc1"});
  EXPECT_EQ(method(df, G::kFc1Fprop), M::kOff);
  EXPECT_EQ(method(df, G::kQkvFprop), M::kRingExchange);
  // Deprecated switches: accepted, one warning each, no effect.
  const Config split = tp2({"--tp-comm-overlap", "--disable-tp-comm-split-ag"});
  EXPECT_EQ(method(split, G::kQkvFprop), M::kRingExchange);
  ASSERT_EQ(split.hint_warnings.size(), 1u);
  EXPECT_NE(split.hint_warnings[0].find("deprecated since Transformer Engine 1.6"), std::string::npos);
  // Switches without --tp-comm-overlap do nothing, and say so.
  const Config alone = tp2({"--disable-tp-comm-overlap-ag"});
  EXPECT_FALSE(alone.distributed.tp_overlap.enabled());
  ASSERT_EQ(alone.hint_warnings.size(), 1u);
  EXPECT_NE(alone.hint_warnings[0].find("no effect without --tp-comm-overlap"), std::string::npos);
}

TEST(TpOverlapPlan, CfgFileOverlaysTheDefaults) {
  const std::string cfg = temp_file("ub.yaml",
                                    "proj_fprop:\n  method: ring_exchange\n"
                                    "fc2_fprop:\n  num_splits: 2\n  atomic_gemm: 0\n"
                                    "qkv_fprop:\n  method: ring_exchange\n  num_splits: 8\n  aggregate: true\n"
                                    "q_down_proj:\n  method: bulk\n");
  const Config c = tp2({"--tp-comm-overlap", "--tp-comm-overlap-cfg", cfg});
  const auto& p = c.distributed.tp_overlap;
  EXPECT_EQ(method(c, G::kProjFprop), M::kRingExchange);
  EXPECT_EQ(method(c, G::kFc2Fprop), M::kPipeline);
  EXPECT_EQ(p.gemm(G::kFc2Fprop).num_splits, 2);
  EXPECT_EQ(p.gemm(G::kQkvFprop).num_splits, 2) << "ring exchange: one chunk per rank, whatever the file says";
  EXPECT_FALSE(p.gemm(G::kQkvFprop).aggregate) << "aggregate needs TP >= 4";
  auto said = [&](const std::string& needle) {
    for (const auto& w : c.hint_warnings)
      if (w.find(needle) != std::string::npos) return true;
    return false;
  };
  EXPECT_TRUE(said("'q_down_proj' is not one of"));
  EXPECT_TRUE(said("qkv_fprop num_splits 8 ignored"));
  EXPECT_TRUE(said("qkv_fprop aggregate ignored"));
  const Config four = build(tiny_args({"--tensor-model-parallel-size", "4", "--sequence-parallel", "--tp-comm-overlap",
                                       "--tp-comm-overlap-cfg", cfg}),
                            4);
  EXPECT_TRUE(four.distributed.tp_overlap.gemm(G::kQkvFprop).aggregate);
}

TEST(TpOverlapPlan, CfgFileErrorsNameFileGemmAndField) {
  auto with = [&](const std::string& name, const std::string& text, std::initializer_list<std::string> more = {}) {
    std::vector<std::string> a = tiny_args({"--tensor-model-parallel-size", "2", "--sequence-parallel", "--tp-comm-overlap",
                                            "--tp-comm-overlap-cfg", temp_file(name, text)});
    a.insert(a.end(), more.begin(), more.end());
    return build(a, 2);
  };
  EXPECT_USER_ERROR(with("f1.yaml", "qkv_fprop:\n  num_warps: 4\n"), "f1.yaml:2: qkv_fprop.num_warps: unknown field");
  EXPECT_USER_ERROR(with("f2.yaml", "proj_fprop:\n  is_reduce_scatter: true\n"), "proj_fprop.is_reduce_scatter");
  EXPECT_USER_ERROR(with("f3.yaml", "qkv_fprop:\n  method: pipeline\n"), "qkv_fprop cannot use method pipeline");
  EXPECT_USER_ERROR(with("f4.yaml", "proj_fprop:\n  method: blocked\n"), "unknown method 'blocked'");
  EXPECT_USER_ERROR(with("f5.yaml", "proj_fprop:\n  num_splits: many\n"), "expected an integer, got 'many'");
  EXPECT_USER_ERROR(with("f6.yaml", "qkv_dgrad:\n  method: ring_exchange\n"), "needs --tp-comm-overlap-rs-dgrad");
  EXPECT_USER_ERROR(with("f7.yaml", "qkv_dgrad:\n  method: pipeline\nqkv_wgrad:\n  method: bulk\n", {"--tp-comm-overlap-rs-dgrad"}),
                    "cannot configure qkv_wgrad when qkv_dgrad uses a non-bulk method");
  EXPECT_USER_ERROR(with("f8.yaml", "proj_fprop:\n  atomic_gemm: 1\n"), "atomic GEMMs exist only for FP8 GEMMs");
  EXPECT_USER_ERROR(with("f9.yaml", "proj_fprop:\n  aggregate: maybe\n"), "expected a boolean");
}

// MindSpeed: MC2 = TE's default plan (its flags are not consulted) plus the output layer.
TEST(TpOverlapPlan, Mc2IsTheDefaultSchedule) {
  const Config mc2 = tp2({"--use-ascend-mc2"});
  const Config te = tp2({"--tp-comm-overlap"});
  EXPECT_EQ(mc2.distributed.tp_overlap.source, TpOverlapSource::kMc2);
  EXPECT_TRUE(mc2.distributed.tp_overlap.output_layer);
  for (size_t i = 0; i < kNumTpGemms; ++i) {
    EXPECT_EQ(mc2.distributed.tp_overlap.gemms[i].method, te.distributed.tp_overlap.gemms[i].method) << i;
    EXPECT_EQ(mc2.distributed.tp_overlap.gemms[i].num_splits, te.distributed.tp_overlap.gemms[i].num_splits) << i;
  }
  EXPECT_NE(ascend_mapping_notice(mc2.distributed.tp_overlap).find("NVIDIA"), std::string::npos);
  EXPECT_TRUE(ascend_mapping_notice(te.distributed.tp_overlap).empty());
}

TEST(TpOverlapPlan, CocPiecesAndModes) {
  const Config coc = tp2({"--use-ascend-coc", "--coc-parallel-num", "2"});
  for (G g : {G::kQkvFprop, G::kFc1Fprop, G::kProjDgrad, G::kFc2Dgrad, G::kProjFprop, G::kFc2Fprop}) {
    EXPECT_EQ(method(coc, g), M::kPipeline) << tp_gemm_name(g);
    EXPECT_EQ(coc.distributed.tp_overlap.gemm(g).num_splits, 2);
  }
  EXPECT_EQ(method(coc, G::kQkvDgrad), M::kBulk);
  EXPECT_FALSE(tp2({"--use-ascend-coc"}).distributed.tp_overlap.enabled()) << "one piece: mode 0, the original linears";
  const Config rewrite = tp2({"--use-ascend-coc", "--coc-parallel-num", "4", "--coc-mode", "1"});
  EXPECT_TRUE(rewrite.distributed.tp_overlap.enabled());
  for (size_t i = 0; i < kNumTpGemms; ++i) EXPECT_EQ(rewrite.distributed.tp_overlap.gemms[i].method, M::kOff);
  const Config fused = tp2({"--use-ascend-coc", "--coc-fused-kernel", "--coc-parallel-num", "4"});
  EXPECT_EQ(method(fused, G::kQkvFprop), M::kRingExchange);
  EXPECT_USER_ERROR(tp2({"--use-ascend-coc", "--coc-parallel-num", "3"}), "--coc-parallel-num");
}

TEST(TpOverlapRules, MessagesNameTheFlags) {
  EXPECT_USER_ERROR(build(tiny_args({"--tensor-model-parallel-size", "2", "--tp-comm-overlap"}), 2),
                    "can happen only when sequence parallelism is enabled");
  EXPECT_USER_ERROR(build(tiny_args({"--sequence-parallel", "--tp-comm-overlap"})),
                    "can happen only when sequence parallelism is enabled");  // TP 1 drops SP, as Megatron
  EXPECT_USER_ERROR(build(tiny_args({"--tensor-model-parallel-size", "2", "--use-ascend-mc2"}), 2),
                    "--use-ascend-mc2 requires both --tensor-model-parallel-size greater than 1 and --sequence-parallel");
  EXPECT_USER_ERROR(build(tiny_args({"--tensor-model-parallel-size", "2", "--use-ascend-coc", "--coc-parallel-num", "2"}), 2),
                    "--use-ascend-coc needs --sequence-parallel");
  EXPECT_USER_ERROR(tp2({"--use-ascend-mc2", "--use-ascend-coc"}), "mc2 and coc can not be used together");
  EXPECT_USER_ERROR(tp2({"--tp-comm-overlap", "--use-ascend-mc2"}), "give one");
  EXPECT_USER_ERROR(tp2({"--tp-comm-overlap", "--deterministic-mode"}), "--deterministic-mode requires: tp_comm_overlap=False (got True)");
  EXPECT_USER_ERROR(tp2({"--use-ascend-mc2", "--deterministic-mode"}), "drop --use-ascend-mc2");
  EXPECT_USER_ERROR(tp2({"--use-ascend-mc2", "--num-experts", "4", "--disable-bias-linear"}),
                    "mc2/coc is not compatible with moe models");
  // --tp-comm-overlap with experts: the routed experts' GEMMs stay unoverlapped (Megatron), the
  // dense and shared-expert linears overlap; not beside the shared expert's side stream.
  EXPECT_TRUE(tp2({"--tp-comm-overlap", "--hidden-size", "64", "--num-experts", "4", "--disable-bias-linear"})
                  .distributed.tp_overlap.enabled());
  EXPECT_USER_ERROR(tp2({"--tp-comm-overlap", "--hidden-size", "64", "--num-experts", "4", "--disable-bias-linear",
                         "--moe-token-dispatcher-type", "alltoall", "--moe-shared-expert-intermediate-size", "32",
                         "--moe-shared-expert-overlap"}),
                    "--tp-comm-overlap with --moe-shared-expert-overlap is not supported by fp8tron");
  // Pieces that do not divide: the hidden size (pipelined reduce-scatter) or the rank's tokens (CoC).
  const std::string three = temp_file("three.yaml", "proj_fprop:\n  method: pipeline\n  num_splits: 3\n");
  EXPECT_USER_ERROR(tp2({"--tp-comm-overlap", "--tp-comm-overlap-cfg", three}),
                    "proj_fprop's pipeline num_splits 3 (Transformer Engine's default is 4; --tp-comm-overlap-cfg sets it) "
                    "does not divide the hidden size 32");
  EXPECT_USER_ERROR(tp2({"--use-ascend-coc", "--coc-parallel-num", "8", "--seq-length", "12", "--micro-batch-size", "1"}),
                    "--coc-parallel-num 8 does not divide the 6 tokens each tensor-parallel rank holds");
  // FP8: each rank's chunk, each split and each piece is an FP8 GEMM operand.
  EXPECT_USER_ERROR(tp2({"--tp-comm-overlap", "--fp8-format", "hybrid", "--seq-length", "8"}),
                    "each rank's 8 tokens");
  EXPECT_USER_ERROR(tp2({"--tp-comm-overlap", "--fp8-format", "hybrid"}), "each split of 8 columns");
  // MC2 splits as TE's defaults do: the message does not send the user to --tp-comm-overlap-cfg,
  // which only --tp-comm-overlap reads.
  EXPECT_USER_ERROR(tp2({"--use-ascend-mc2", "--fp8-format", "hybrid", "--seq-length", "32"}),
                    "proj_fprop's pipeline num_splits 4 (--use-ascend-mc2 splits as Transformer Engine's defaults do, in 4): "
                    "with FP8 each split of 8 columns is an FP8 GEMM operand and needs a multiple of 16; use --tp-comm-overlap "
                    "with fewer splits (--tp-comm-overlap-cfg) or a larger --hidden-size");
  EXPECT_USER_ERROR(tp2({"--use-ascend-coc", "--coc-parallel-num", "2", "--fp8-format", "hybrid", "--hidden-size", "64"}),
                    "each piece of 8 tokens");
  EXPECT_USER_ERROR(tp2({"--tp-comm-overlap", "--fp8-format", "e4m3", "--fp8-recipe", "blockwise", "--hidden-size", "256",
                         "--num-attention-heads", "4"}),
                    "must hold whole 128x128 weight blocks");
  EXPECT_NO_THROW(tp2({"--tp-comm-overlap", "--hidden-size", "64"}));
}

TEST(PipelineOverlapFlags, MegatronDefaultsAndRules) {
  auto pp2 = [](std::initializer_list<std::string> extra) {
    std::vector<std::string> a = tiny_args({"--pipeline-model-parallel-size", "2", "--num-layers", "4", "--global-batch-size", "4"});
    a.insert(a.end(), extra.begin(), extra.end());
    return build(a, 2);
  };
  // Megatron: without the overlap an interleaved schedule needs more than 2 stages (no two p2p
  // sends and receives between the same ranks in one batch).
  auto pp4 = [](std::initializer_list<std::string> extra) {
    std::vector<std::string> a = tiny_args({"--pipeline-model-parallel-size", "4", "--num-layers", "8", "--global-batch-size", "8"});
    a.insert(a.end(), extra.begin(), extra.end());
    return build(a, 4);
  };
  const Config interleaved = pp2({"--num-layers-per-virtual-pipeline-stage", "1"});
  EXPECT_TRUE(interleaved.distributed.overlap_p2p) << "Megatron: on by default";
  EXPECT_FALSE(pp4({"--num-layers-per-virtual-pipeline-stage", "1", "--no-overlap-p2p-communication"}).distributed.overlap_p2p);
  EXPECT_USER_ERROR(pp2({"--num-layers-per-virtual-pipeline-stage", "1", "--no-overlap-p2p-communication"}),
                    "needs --pipeline-model-parallel-size > 2");
  EXPECT_TRUE(pp2({"--num-layers-per-virtual-pipeline-stage", "1", "--overlap-p2p-communication"}).distributed.overlap_p2p);
  const Config plain = pp2({});
  EXPECT_FALSE(plain.distributed.overlap_p2p) << "forced off without virtual stages";
  ASSERT_EQ(plain.hint_warnings.size(), 1u);
  EXPECT_NE(plain.hint_warnings[0].find("non-interleaved schedule"), std::string::npos);
  EXPECT_TRUE(build(tiny_args()).hint_warnings.empty()) << "no warning without a pipeline";
  EXPECT_TRUE(pp2({"--num-layers-per-virtual-pipeline-stage", "1", "--overlap-p2p-communication-warmup-flush"})
                  .distributed.overlap_p2p_warmup_flush);
  EXPECT_USER_ERROR(pp2({"--overlap-p2p-communication-warmup-flush"}),
                    "only compatible with overlap_p2p_comm but not batch_p2p_comm");
  EXPECT_USER_ERROR(pp4({"--num-layers-per-virtual-pipeline-stage", "1", "--no-overlap-p2p-communication",
                         "--overlap-p2p-communication-warmup-flush"}),
                    "only compatible with overlap_p2p_comm");
}

TEST(Fp8ParamGatherFlag, MegatronRules) {
  auto dp2 = [](std::initializer_list<std::string> extra) {
    std::vector<std::string> a = tiny_args({"--fp8-format", "hybrid", "--fp8-param-gather"});
    a.insert(a.end(), extra.begin(), extra.end());
    return build(a, 2);
  };
  EXPECT_TRUE(dp2({"--use-distributed-optimizer"}).precision.fp8.param_gather);
  EXPECT_USER_ERROR(dp2({}), "--fp8-param-gather only supported with distributed optimizer");
  EXPECT_USER_ERROR(dp2({"--use-distributed-optimizer", "--fp8-recipe", "blockwise", "--fp8-format", "e4m3"}),
                    "--fp8-param-gather with --fp8-recipe blockwise is not supported yet");
  EXPECT_USER_ERROR(dp2({"--use-distributed-optimizer", "--fp8-recipe", "tensorwise", "--fp8-format", "hif8"}),
                    "--fp8-format hif8 is not supported");
  EXPECT_USER_ERROR(build(tiny_args({"--fp8-param-gather", "--use-distributed-optimizer"}), 2), "it needs --fp8-format");
  // The experts' weights are gathered as FP8 by their own (expert data-parallel) optimizer domain.
  EXPECT_TRUE(dp2({"--use-distributed-optimizer", "--num-experts", "4"}).precision.fp8.param_gather);
}

}  // namespace fp8tron
