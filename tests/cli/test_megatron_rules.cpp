// pretrain_gpt.py's defaults and Megatron's validation rules as fp8tron applies them (so that a
// Megatron user's script runs unchanged): the tokenizer default, --split, --train-iters with the
// -samples flags, virtual-pipeline derivation and the interleaved micro-batch rule, pipeline
// layouts and the account-for flags, model-variant rules, the pipeline schedule table.
#include <gtest/gtest.h>

#include <algorithm>

#include "core/config/batch_schedule.h"
#include "core/text.h"
#include "parallel/layer_split.h"
#include "parallel/pipeline_layout.h"
#include "parallel/pipeline_schedule.h"
#include "tests/test_helpers.h"

namespace fp8tron {
using namespace fp8tron::testing;

std::vector<std::string> without(std::vector<std::string> args, const std::string& flag, int values = 0) {
  auto it = std::find(args.begin(), args.end(), flag);
  if (it != args.end()) args.erase(it, it + 1 + values);
  return args;
}

// --use-precision-aware-optimizer and its dtypes (Megatron's OptimizerConfig and validate_args
// rules, and what fp8tron refuses by name).
TEST(MegatronRules, PrecisionAwareOptimizer) {
  auto args = [](std::initializer_list<std::string> extra) {
    std::vector<std::string> a = tiny_args({"--bf16"});
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  };
  const Config ok = build(args({"--use-distributed-optimizer", "--use-precision-aware-optimizer", "--exp-avg-dtype", "bf16",
                                "--exp-avg-sq-dtype", "bf16", "--main-grads-dtype", "bf16"}));
  EXPECT_TRUE(ok.optimizer.precision_aware.enabled);
  EXPECT_EQ(ok.optimizer.precision_aware.exp_avg, StateDtype::Bf16);
  EXPECT_EQ(ok.optimizer.precision_aware.exp_avg_sq, StateDtype::Bf16);
  EXPECT_FALSE(ok.precision.grads_in_fp32);
  const Config fp32_grads = build(args({"--use-distributed-optimizer", "--use-precision-aware-optimizer"}));
  EXPECT_TRUE(fp32_grads.precision.grads_in_fp32);
  EXPECT_EQ(fp32_grads.optimizer.precision_aware.exp_avg, StateDtype::Fp32);
  EXPECT_USER_ERROR(build(args({"--exp-avg-dtype", "bf16"})), "--exp-avg-dtype bf16 needs --use-precision-aware-optimizer");
  EXPECT_USER_ERROR(build(args({"--main-grads-dtype", "bf16", "--use-distributed-optimizer"})),
                    "--main-grads-dtype bf16 needs --use-precision-aware-optimizer");
  EXPECT_USER_ERROR(build(args({"--use-precision-aware-optimizer"})),
                    "--use-precision-aware-optimizer needs --use-distributed-optimizer");
  EXPECT_USER_ERROR(build(args({"--use-precision-aware-optimizer", "--use-distributed-optimizer", "--optimizer", "sgd"})),
                    "supports --optimizer adam only");
  const Config scaled = build(args({"--use-precision-aware-optimizer", "--use-distributed-optimizer", "--exp-avg-dtype",
                                    "fp8", "--exp-avg-sq-dtype", "fp16"}));
  EXPECT_EQ(scaled.optimizer.precision_aware.exp_avg, StateDtype::Fp8);
  EXPECT_EQ(scaled.optimizer.precision_aware.exp_avg_sq, StateDtype::Fp16);
  const Config fp8_second = build(args({"--use-precision-aware-optimizer", "--use-distributed-optimizer",
                                        "--exp-avg-sq-dtype", "fp8"}));
  EXPECT_TRUE(std::any_of(fp8_second.hint_warnings.begin(), fp8_second.hint_warnings.end(),
                          [](const std::string& w) { return w.find("--exp-avg-sq-dtype fp8 keeps") == 0; }));
  EXPECT_USER_ERROR(build(args({"--use-precision-aware-optimizer", "--use-distributed-optimizer", "--exp-avg-dtype", "fp8",
                                "--overlap-param-gather-with-optimizer-step"})),
                    "--exp-avg-dtype fp8 with --overlap-param-gather-with-optimizer-step is not supported");
  const Config fp16_main = build(args({"--use-precision-aware-optimizer", "--use-distributed-optimizer", "--main-params-dtype",
                                       "fp16"}));
  EXPECT_EQ(fp16_main.optimizer.precision_aware.main_params, StateDtype::Fp16);
  EXPECT_USER_ERROR(build(without(args({"--use-precision-aware-optimizer", "--use-distributed-optimizer",
                                        "--main-params-dtype", "fp16"}),
                                  "--bf16")),
                    "--main-params-dtype fp16 needs --bf16 or --fp16");
  EXPECT_USER_ERROR(build(args({"--use-precision-aware-optimizer", "--use-distributed-optimizer", "--main-params-dtype", "fp16",
                                "--fp8-format", "hybrid", "--fp8-param-gather"})),
                    "--main-params-dtype fp16 with --fp8-param-gather is not supported");
  EXPECT_USER_ERROR(build(args({"--use-precision-aware-optimizer", "--use-distributed-optimizer", "--main-params-dtype", "fp16",
                                "--overlap-param-gather-with-optimizer-step"})),
                    "--main-params-dtype fp16 with --overlap-param-gather-with-optimizer-step is not supported");
  EXPECT_USER_ERROR(build(args({"--main-params-dtype", "fp16", "--use-distributed-optimizer"})),
                    "--main-params-dtype fp16 needs --use-precision-aware-optimizer");
  EXPECT_USER_ERROR(build(args({"--use-precision-aware-optimizer", "--use-distributed-optimizer", "--main-grads-dtype", "bf16",
                                "--accumulate-allreduce-grads-in-fp32"})),
                    "contradicts --accumulate-allreduce-grads-in-fp32");
  EXPECT_USER_ERROR(build(without(args({"--use-precision-aware-optimizer", "--use-distributed-optimizer", "--main-grads-dtype",
                                        "bf16"}),
                                  "--bf16")),
                    "--main-grads-dtype bf16 needs --bf16");
}

TEST(MegatronRules, TokenizerDefaultsAsPretrainGpt) {
  auto mock = without(tiny_args({"--mock-data"}), "--builtin-data");
  // --mock-data with --vocab-size and no tokenizer: a NullTokenizer of --vocab-size ids, said.
  Config c = build(mock);
  EXPECT_EQ(c.data.tokenizer_type, "NullTokenizer");
  EXPECT_TRUE(c.data.tokenizer_defaulted);
  EXPECT_EQ(c.model.vocab_size, 64);
  EXPECT_EQ(c.data.eod, 63);
  EXPECT_NE(c.notices.front().find("using a NullTokenizer of --vocab-size 64 ids"), std::string::npos);
  // Without --vocab-size it is GPT2BPETokenizer, which needs its files.
  EXPECT_USER_ERROR(build(without(mock, "--vocab-size", 1)), "pretrain_gpt.py's default");
  // An explicit tokenizer with mock data is built (its vocabulary is the model's).
  LaunchEnv env;
  auto args = mock;
  for (const char* a : {"--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", "v", "--merge-file", "m"}) args.push_back(a);
  Config g = build_config(parse(args), env, false, [](const DataConfig&) { return TokenizerInfo{50257, 50256}; });
  EXPECT_EQ(g.model.vocab_size, 50257);
  // --null-tokenizer-eod-id; a pad id equal to the eod id is dropped (Megatron's collision rule).
  Config n = build(without(tiny_args({"--mock-data", "--tokenizer-type", "NullTokenizer", "--null-tokenizer-eod-id", "0",
                                      "--null-tokenizer-pad-id", "0"}),
                           "--builtin-data"));
  EXPECT_EQ(n.data.eod, 0);
  EXPECT_EQ(n.data.pad, -1);
  EXPECT_USER_ERROR(build(tiny_args({"--tokenizer-type", "GPT2BPETokenizer"})), "not used by --builtin-data");
}

TEST(MegatronRules, SplitWarnings) {
  auto files = without(tiny_args({"--data-path", "x", "--tokenizer-type", "NullTokenizer"}), "--builtin-data");
  Config c = build(files);
  EXPECT_EQ(c.data.split, "969, 30, 1");
  EXPECT_NE(c.hint_warnings.back().find("Using legacy default value \"969, 30, 1\""), std::string::npos);
  auto mock = without(tiny_args({"--mock-data", "--split", "99,1,0"}), "--builtin-data");
  EXPECT_NE(build(mock).hint_warnings.back().find("--split has no effect with --mock-data"), std::string::npos);
}

// validate_args: the other mode's flags must be unset or zero.
TEST(MegatronRules, IterationsAndSamples) {
  Config c = build(tiny_args({"--lr-warmup-samples", "0", "--lr-warmup-fraction", "0.1", "--lr-warmup-iters", "0"}));
  EXPECT_DOUBLE_EQ(c.lr_schedule.warmup_steps, 0.1 * 20);  // a float: 2.0
  EXPECT_DOUBLE_EQ(build(tiny_args({"--lr-warmup-fraction", "0.07"})).lr_schedule.warmup_steps, 0.07 * 20);  // not truncated
  EXPECT_USER_ERROR(build(tiny_args({"--lr-warmup-samples", "8"})), "--lr-warmup-samples is for --train-samples");
  EXPECT_NE(build(tiny_args({"--lr-decay-style", "WSD", "--lr-wsd-decay-iters", "2", "--lr-wsd-decay-samples", "4"}))
                .hint_warnings.back()
                .find("--lr-wsd-decay-samples has no effect with --train-iters"),
            std::string::npos);
  auto samples = without(tiny_args({"--train-samples", "40", "--lr-warmup-iters", "0"}), "--train-iters", 1);
  EXPECT_EQ(build(samples).training.train_iters, 20);
  samples.push_back("--lr-decay-iters");
  samples.push_back("5");
  EXPECT_USER_ERROR(build(samples), "--lr-decay-iters is for --train-iters");
  EXPECT_USER_ERROR(build(tiny_args({"--global-batch-size", "6", "--rampup-batch-size", "2", "2", "10"})),
                    "needs sample-based training");
}

TEST(MegatronRules, VirtualPipelineAndInterleavedMicroBatches) {
  // VPP 1 from either flag is no interleaving, not an error.
  EXPECT_EQ(build(tiny_args({"--num-virtual-stages-per-pipeline-rank", "1"})).distributed.virtual_stages, 1);
  // Megatron's tunable-overlap test: 12 layers, PP 4, 1 layer per virtual stage (VPP 3),
  // 40 / (4 x 2) = 5 micro-batches in groups of 5.
  auto tunable = tiny_args({"--num-layers", "12", "--pipeline-model-parallel-size", "4", "--num-layers-per-virtual-pipeline-stage",
                            "1", "--micro-batch-size", "4", "--global-batch-size", "40"});
  EXPECT_USER_ERROR(build(tunable, 8), "micro-batches (5) to be a multiple of 4");  // groups of PP: 5 mod 4 = 1 < 4
  tunable.push_back("--microbatch-group-size-per-virtual-pipeline-stage");
  tunable.push_back("5");
  Config c = build(tunable, 8);
  EXPECT_EQ(c.distributed.virtual_stages, 3);
  EXPECT_EQ(c.distributed.microbatch_group_size, 5);
  // Without p2p overlap an interleaved schedule needs PP > 2.
  EXPECT_USER_ERROR(build(tiny_args({"--num-layers", "4", "--pipeline-model-parallel-size", "2",
                                     "--num-layers-per-virtual-pipeline-stage", "1", "--global-batch-size", "4",
                                     "--no-overlap-p2p-communication"}), 2),
                    "needs --pipeline-model-parallel-size > 2");
}

// Megatron's gpt3_mcore_te_tp1_pp4_vp2_account_for_embedding_loss_in_pipeline_split: 6 layers,
// PP 4, VPP 2: 8 slots; rank 0's first chunk is the embedding only, rank 3's last the loss only;
// chunk (pp, c) starts at layer 4c + pp - 1.
TEST(MegatronRules, AccountForEmbeddingAndLoss) {
  PipelineSplit p;
  p.num_layers = 6;
  p.pp = 4;
  p.chunks = 2;
  p.account_for_embedding = p.account_for_loss = true;
  for (int pp = 0; pp < 4; ++pp) {
    auto chunks = plan_pipeline_chunks(p, pp);
    ASSERT_EQ(chunks.size(), 2u);
    for (int c = 0; c < 2; ++c) {
      const bool empty = (pp == 0 && c == 0) || (pp == 3 && c == 1);
      EXPECT_EQ(chunks[size_t(c)].num_layers, empty ? 0 : 1) << pp << "," << c;
      if (!empty) EXPECT_EQ(chunks[size_t(c)].first_layer, 4 * c + pp - 1);
    }
  }
  EXPECT_TRUE(plan_pipeline_chunks(p, 0)[0].embedding);
  EXPECT_TRUE(plan_pipeline_chunks(p, 3)[1].loss);
  Config c = build(tiny_args({"--num-layers", "6", "--pipeline-model-parallel-size", "4", "--num-virtual-stages-per-pipeline-rank",
                              "2", "--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split",
                              "--global-batch-size", "8"}),
                   4);
  EXPECT_EQ(c.distributed.virtual_stages, 2);
  // The uneven-PP flags cannot be combined with them.
  EXPECT_USER_ERROR(build(tiny_args({"--num-layers", "6", "--pipeline-model-parallel-size", "2",
                                     "--decoder-first-pipeline-num-layers", "2", "--account-for-loss-in-pipeline-split"}), 2),
                    "cannot be combined");
}

TEST(MegatronRules, PipelineLayouts) {
  auto stages = parse_pipeline_layout("Et*3|(tt|)*29,m|L");
  ASSERT_EQ(stages.size(), 32u);
  EXPECT_EQ(stages.front(), "Ettt");
  EXPECT_EQ(stages[1], "tt");
  EXPECT_EQ(stages[30], "m");
  EXPECT_EQ(stages[31], "L");
  EXPECT_USER_ERROR(parse_pipeline_layout("Et|x"), "invalid layer character 'x'");
  // Megatron's 15-layer test layout on PP 2: 8 stages, VPP 4; rank 1 holds stages 1, 3, 5, 7.
  auto fifteen = parse_pipeline_layout("Et*3|(tt|)*6L");
  ASSERT_EQ(fifteen.size(), 8u);
  EXPECT_NO_THROW(validate_pipeline_layout(fifteen, 15, 0, 2));
  PipelineSplit p;
  p.num_layers = 15;
  p.pp = 2;
  p.chunks = 4;
  p.layout = fifteen;
  auto rank1 = plan_pipeline_chunks(p, 1);
  EXPECT_EQ(rank1[0].first_layer, 3);
  EXPECT_EQ(rank1[3].num_layers, 0);
  EXPECT_TRUE(rank1[3].loss);
  EXPECT_USER_ERROR(validate_pipeline_layout(fifteen, 16, 0, 2), "15 transformer layers t but --num-layers is 16");
  EXPECT_USER_ERROR(validate_pipeline_layout(parse_pipeline_layout("Ettm|tL"), 3, 1, 2), "before the MTP layers");
  Config c = build(tiny_args({"--num-layers", "15", "--pipeline-model-parallel-size", "2", "--pipeline-model-parallel-layout",
                              "Et*3|(tt|)*6L", "--micro-batch-size", "1", "--global-batch-size", "8"}),
                   2);
  EXPECT_EQ(c.distributed.virtual_stages, 4);
  // fp8tron runs the MTP layers with the loss.
  EXPECT_USER_ERROR(build(tiny_args({"--num-layers", "2", "--pipeline-model-parallel-size", "2", "--pipeline-model-parallel-layout",
                                     "Et|t|m|L", "--mtp-num-layers", "1", "--position-embedding-type", "rope",
                                     "--global-batch-size", "4"}), 2),
                    "in the stage that holds the loss");
}

TEST(MegatronRules, UnevenPipelineWithVirtualStages) {
  PipelineSplit p;
  p.num_layers = 12;
  p.pp = 4;
  p.chunks = 2;
  p.first_stage_layers = 2;
  p.last_stage_layers = 2;
  EXPECT_EQ(plan_pipeline_chunks(p, 0)[1].first_layer, 6);  // chunk 1 starts after 1 + 2 + 2 + 1 layers
  EXPECT_EQ(plan_pipeline_chunks(p, 1)[0].num_layers, 2);
  p.first_stage_layers = 3;
  EXPECT_USER_ERROR(plan_pipeline_chunks(p, 0), "not divisible by the 2 virtual stages");
}

TEST(MegatronRules, ModelVariantRules) {
  EXPECT_USER_ERROR(build(tiny_args({"--squared-relu"})), "--squared-relu needs --disable-bias-linear or --no-bias-gelu-fusion");
  EXPECT_NO_THROW(build(tiny_args({"--squared-relu", "--no-bias-gelu-fusion"})));
  EXPECT_USER_ERROR(build(tiny_args({"--squared-relu", "--swiglu", "--disable-bias-linear"})), "cannot be used together");
  EXPECT_USER_ERROR(build(tiny_args({"--multi-latent-attention", "--group-query-attention"})), "mutually exclusive");
  EXPECT_USER_ERROR(build(tiny_args({"--multi-latent-attention", "--rotary-interleaved"})), "--rotary-interleaved cannot");
  EXPECT_USER_ERROR(build(tiny_args({"--multi-latent-attention", "--attention-output-gate"})),
                    "--attention-output-gate cannot be used with --multi-latent-attention");
  EXPECT_USER_ERROR(build(tiny_args({"--position-embedding-type", "yarn", "--rotary-interleaved"})), "--rotary-interleaved cannot");
  EXPECT_USER_ERROR(build(tiny_args({"--mtp-num-layers", "1", "--position-embedding-type", "yarn"})), "not supported with 'yarn'");
  EXPECT_USER_ERROR(build(tiny_args({"--position-embedding-type", "mrope"})), "mrope is not supported");
  EXPECT_USER_ERROR(build(tiny_args({"--rope-type", "yarn"})), "--rope-type yarn is for --multi-latent-attention");
  EXPECT_USER_ERROR(build(tiny_args({"--calculate-per-token-loss", "--ddp-average-in-collective"})), "cannot be combined");
  EXPECT_USER_ERROR(build(tiny_args({"--q-lora-rank", "8"})), "need --multi-latent-attention");
  Config muon = build(tiny_args({"--optimizer", "dist_muon"}));
  EXPECT_EQ(muon.optimizer.optimizer, "muon");
  EXPECT_TRUE(muon.distributed.distributed_optimizer);
  EXPECT_USER_ERROR(build(tiny_args({"--optimizer", "muon", "--muon-fp32-matmul-prec", "low"})), "not a torch matmul precision");
  EXPECT_USER_ERROR(build(tiny_args({"--optimizer", "lion"})), "--optimizer lion is not supported");
  EXPECT_USER_ERROR(build(tiny_args({"--decoupled-min-lr", "1e-5"})), "--decoupled-min-lr needs --decoupled-lr");
  EXPECT_USER_ERROR(build(tiny_args({"--export-kd-cfg", "x"})), "NVIDIA ModelOpt flags");
  // Megatron's MTP layer is an MoE layer when the decoder's last one is (tests/models/test_mtp_moe.cpp).
  const Config mtp_moe = build(tiny_args({"--num-experts", "4", "--mtp-num-layers", "1", "--position-embedding-type", "rope"}));
  EXPECT_TRUE(mtp_layers_are_moe(mtp_moe.model, true));
  // Muon with the distributed optimizer: accepted (whole matrices per data-parallel rank), but not
  // with FP8 parameters.
  EXPECT_TRUE(build(tiny_args({"--optimizer", "muon", "--use-distributed-optimizer", "--global-batch-size", "4"}), 2)
                  .distributed.distributed_optimizer);
  EXPECT_USER_ERROR(build(tiny_args({"--optimizer", "muon", "--use-distributed-optimizer", "--global-batch-size", "4",
                                     "--fp8-format", "hybrid", "--fp8-param-gather", "--hidden-size", "64"}),
                          2),
                    "--fp8-param-gather with --optimizer muon is not supported");
}

// --deterministic-mode: Megatron's apply_determinism_to_args verifies cross_entropy_loss_fusion
// and tp_comm_overlap are off and refuses otherwise (it never switches them off itself).
TEST(MegatronRules, DeterministicModeRefusesWhatMegatronRefuses) {
  EXPECT_USER_ERROR(build(tiny_args({"--deterministic-mode", "--cross-entropy-loss-fusion"})),
                    "--deterministic-mode requires: cross_entropy_loss_fusion=False (got True)");
  EXPECT_USER_ERROR(build(tiny_args({"--deterministic-mode", "--cross-entropy-loss-fusion", "--tensor-model-parallel-size",
                                     "2", "--sequence-parallel", "--tp-comm-overlap"}),
                          2),
                    "cross_entropy_loss_fusion=False (got True), tp_comm_overlap=False (got True)");
  EXPECT_NO_THROW(build(tiny_args({"--deterministic-mode"})));
  EXPECT_NO_THROW(build(tiny_args({"--cross-entropy-loss-fusion"})));
}

// --overlap-moe-expert-parallel-comm: Megatron's TransformerConfig rules, each a one-line error
// naming the flag and the fix; what fp8tron's combined schedule cannot run yet (the interleaved
// pipeline) refused by name. --delay-wgrad-compute: Megatron's rules.
TEST(MegatronRules, ExpertParallelOverlapFollowsMegatronsRules) {
  auto args = [](std::initializer_list<std::string> extra) {
    auto a = tiny_args({"--num-experts", "4", "--expert-model-parallel-size", "2", "--moe-token-dispatcher-type", "alltoall",
                        "--bf16", "--overlap-moe-expert-parallel-comm", "--global-batch-size", "4"});
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  };
  const Config accepted = build(args({}), 2);
  EXPECT_TRUE(accepted.model.moe.overlap_expert_parallel_comm);
  for (const auto& w : accepted.hint_warnings) EXPECT_EQ(w.find("--overlap-moe-expert-parallel-comm"), std::string::npos) << w;
  EXPECT_FALSE(build(tiny_args({"--num-experts", "4", "--expert-model-parallel-size", "2", "--bf16", "--global-batch-size", "4"}), 2)
                   .model.moe.overlap_expert_parallel_comm);
  EXPECT_NO_THROW(build(args({"--recompute-activations"}), 2));  // selective core_attn: no all-to-all replayed
  EXPECT_NO_THROW(build(args({"--moe-shared-expert-intermediate-size", "32", "--disable-bias-linear"}), 2));
  EXPECT_NO_THROW(build(args({"--mtp-num-layers", "1", "--position-embedding-type", "rope"}), 2));
  EXPECT_USER_ERROR(build(args({"--moe-token-dispatcher-type", "allgather"}), 2),
                    "--overlap-moe-expert-parallel-comm is supported with the alltoall/flex token dispatcher");
  EXPECT_USER_ERROR(build(args({"--expert-model-parallel-size", "1"}), 2),
                    "--overlap-moe-expert-parallel-comm is only supported with expert model parallelism");
  EXPECT_USER_ERROR(build(args({"--pipeline-model-parallel-size", "2", "--global-batch-size", "8"}), 4),
                    "a virtual pipeline must be specified");
  EXPECT_NO_THROW(build(args({"--pipeline-model-parallel-size", "2", "--num-layers", "4",
                              "--num-virtual-stages-per-pipeline-rank", "2", "--global-batch-size", "8"}),
                        4));
  EXPECT_USER_ERROR(build(args({"--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"}), 2),
                    "disable full recomputation");
  EXPECT_USER_ERROR(build(args({"--recompute-granularity", "selective", "--recompute-modules", "moe"}), 2),
                    "disable moe in --recompute-modules");
  EXPECT_USER_ERROR(build(args({"--moe-shared-expert-intermediate-size", "32", "--disable-bias-linear",
                                "--moe-shared-expert-overlap"}),
                          2),
                    "--overlap-moe-expert-parallel-comm: disable --moe-shared-expert-overlap");
  EXPECT_USER_ERROR(build(args({"--mtp-num-layers", "2", "--position-embedding-type", "rope"}), 2), "at most one layer");
  EXPECT_USER_ERROR(build(args({"--cuda-graph-impl", "transformer_engine", "--cuda-graph-scope", "attn", "moe"}), 2),
                    "--overlap-moe-expert-parallel-comm: CUDA graph scope on moe and mlp is not supported");
  auto fp32 = tiny_args({"--num-experts", "4", "--expert-model-parallel-size", "2", "--moe-token-dispatcher-type", "alltoall",
                         "--overlap-moe-expert-parallel-comm", "--global-batch-size", "4"});
  EXPECT_USER_ERROR(build(fp32, 2), "only supported with --bf16 or --fp16");
  // --delay-wgrad-compute: Megatron's rules (arguments.py, TransformerConfig), each one line; the
  // tensor-parallel overlap's linears, which compute their own weight gradients, refused by name.
  EXPECT_USER_ERROR(build(tiny_args({"--num-experts", "4", "--expert-model-parallel-size", "2", "--bf16",
                                     "--delay-wgrad-compute", "--global-batch-size", "4"}),
                          2),
                    "--delay-wgrad-compute: overlap_moe_expert_parallel_comm must be enabled (Megatron): add "
                    "--overlap-moe-expert-parallel-comm");
  const Config delayed = build(args({"--delay-wgrad-compute"}), 2);
  EXPECT_TRUE(delayed.model.moe.delay_wgrad_compute);
  EXPECT_TRUE(delayed.not_supported_yet.empty());
  EXPECT_NO_THROW(require_supported(delayed));
  EXPECT_FALSE(accepted.model.moe.delay_wgrad_compute);
  EXPECT_NO_THROW(build(args({"--delay-wgrad-compute", "--use-distributed-optimizer", "--overlap-grad-reduce",
                              "--no-gradient-accumulation-fusion", "--global-batch-size", "8"}),
                        4));
  EXPECT_USER_ERROR(build(args({"--delay-wgrad-compute", "--transformer-impl", "local"}), 2),
                    "--delay-wgrad-compute is only supported with the transformer_engine implementation (Megatron)");
  EXPECT_USER_ERROR(build(args({"--delay-wgrad-compute", "--overlap-dispatch-backward-with-experts-wgrad"}), 2),
                    "--delay-wgrad-compute and --overlap-dispatch-backward-with-experts-wgrad are mutually exclusive");
  // CUDA graphs that capture weight gradients, with the overlapped gradient reduction.
  EXPECT_USER_ERROR(build(args({"--delay-wgrad-compute", "--overlap-grad-reduce", "--no-gradient-accumulation-fusion",
                                "--cuda-graph-impl", "transformer_engine", "--cuda-graph-scope", "attn"}),
                          2),
                    "CUDA graph with delay_wgrad_compute requires gradient_accumulation_fusion (Megatron)");
  EXPECT_USER_ERROR(build(args({"--delay-wgrad-compute", "--overlap-grad-reduce", "--cuda-graph-impl",
                                "transformer_engine", "--cuda-graph-scope", "attn"}),
                          2),
                    "CUDA graph with delay_wgrad_compute doesn't support attn bias (Megatron)");
  EXPECT_USER_ERROR(build(args({"--delay-wgrad-compute", "--overlap-grad-reduce", "--no-gradient-accumulation-fusion",
                                "--cuda-graph-impl", "transformer_engine", "--cuda-graph-scope", "moe_router",
                                "--moe-shared-expert-intermediate-size", "32", "--disable-bias-linear"}),
                          2),
                    "requires gradient_accumulation_fusion");
  EXPECT_NO_THROW(build(args({"--delay-wgrad-compute", "--cuda-graph-impl", "transformer_engine", "--cuda-graph-scope",
                              "attn", "--disable-bias-linear", "--overlap-grad-reduce"}),
                        2));
  EXPECT_NO_THROW(build(args({"--delay-wgrad-compute", "--no-gradient-accumulation-fusion", "--cuda-graph-impl",
                              "transformer_engine", "--cuda-graph-scope", "attn"}),
                        2));  // Megatron checks the graphs only with the overlapped reduction
  EXPECT_USER_ERROR(build(args({"--delay-wgrad-compute", "--tensor-model-parallel-size", "2", "--sequence-parallel",
                                "--disable-bias-linear", "--tp-comm-overlap"}),
                          4),
                    "--delay-wgrad-compute with --tp-comm-overlap is not supported yet in fp8tron");
}

// --step-batch-size-schedule: thresholds in tokens (K/M/B/T suffixes) over --seq-length (16):
// 0.064K tokens = 4 samples; update_train_iters walks it (4, then 8 per step).
// --defer-embedding-wgrad-compute: Megatron's ModelParallelConfig rules.
TEST(MegatronRules, DeferredEmbeddingWgrad) {
  const auto pp2 = [](std::initializer_list<std::string> extra) {
    auto a = tiny_args({"--pipeline-model-parallel-size", "2", "--defer-embedding-wgrad-compute"});
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  };
  Config c = build(pp2({"--wgrad-deferral-limit", "3"}), 2);
  EXPECT_TRUE(c.distributed.defer_embedding_wgrad);
  EXPECT_EQ(c.distributed.wgrad_deferral_limit, 3);
  EXPECT_USER_ERROR(build(tiny_args({"--defer-embedding-wgrad-compute"})),
                    "Cannot defer embedding wgrad compute when pipeline model parallel is not used");
  EXPECT_USER_ERROR(build(pp2({"--no-gradient-accumulation-fusion"}), 2),
                    "Cannot defer embedding wgrad compute when gradient accumulation fusion is not used");
  EXPECT_USER_ERROR(build(pp2({"--wgrad-deferral-limit", "-1"}), 2), "--wgrad-deferral-limit must be >= 0");
}

TEST(MegatronRules, StepBatchSizeSchedule) {
  auto args = without(tiny_args({"--train-samples", "24", "--step-batch-size-schedule", "0:4, 0.064K:8"}), "--train-iters", 1);
  Config c = build(args);
  ASSERT_EQ(c.training.step_batch_schedule.size(), 2u);
  EXPECT_EQ(c.training.step_batch_schedule[1], (std::pair<int64_t, int64_t>{64 / 16, 8}));
  const BatchSchedule s = BatchSchedule::of(c.training, 1);
  EXPECT_EQ(s.global_batch(0), 4);
  EXPECT_EQ(s.global_batch(4), 8);
  EXPECT_EQ(c.training.train_iters, 4);  // 0 -> 4 -> 12 -> 20 -> 28 >= 24
  EXPECT_EQ(c.training.global_batch_size, 2);  // micro x dp: the evaluation batch, as Megatron's
  args.push_back("--global-batch-size");
  args.push_back("8");
  EXPECT_USER_ERROR(build(args), "Cannot specify both --step-batch-size-schedule and --global-batch-size");
  EXPECT_USER_ERROR(build(without(tiny_args({"--train-samples", "24", "--step-batch-size-schedule", "16:4"}), "--train-iters", 1)),
                    "the first entry must have threshold 0");
  auto schedule = [&](const std::string& text) {
    return build(without(tiny_args({"--train-samples", "24", "--step-batch-size-schedule", text}), "--train-iters", 1));
  };
  EXPECT_USER_ERROR(schedule("0:4 -16:8"), "'-16' is not a non-negative number");
  EXPECT_USER_ERROR(schedule("0:4 infK:8"), "'infK' is not a non-negative number");
  EXPECT_USER_ERROR(schedule("0:4 16"), "invalid entry \"16\"");
  EXPECT_USER_ERROR(schedule("0:4 16:8 31:12"), "strictly increasing");  // 16 and 31 tokens are both 1 sample
  EXPECT_EQ(schedule("1.5k:8,0:4").training.step_batch_schedule.front().second, 4);  // sorted, lower-case suffix
}

// Megatron's schedule table for M = 5, N = 5, VPP 2: all five micro-batches on chunk 0, then on
// chunk 1; the last rank of PP 4 warms up with (4 - 3 - 1) x 2 + (2 - 1) x 5 = 5 forwards.
TEST(MegatronRules, InterleavedScheduleTable) {
  auto order = pipeline_order(4, 3, 2, 5, 5);
  ASSERT_EQ(order.size(), 20u);
  for (int i = 0; i < 5; ++i) {
    EXPECT_TRUE(order[size_t(i)].forward);
    EXPECT_EQ(order[size_t(i)].chunk, 0);
    EXPECT_EQ(order[size_t(i)].micro_batch, i);
  }
  EXPECT_TRUE(order[5].forward);
  EXPECT_EQ(order[5].chunk, 1);
  EXPECT_FALSE(order[6].forward);
  EXPECT_EQ(order[6].chunk, 1);  // the first backward runs the last chunk
  EXPECT_EQ(order[6].micro_batch, 0);
  // The default groups (N = PP) reproduce the classic interleaved order.
  auto classic = pipeline_order(2, 0, 2, 4);
  EXPECT_EQ(classic[2].chunk, 1);
  EXPECT_EQ(classic[2].micro_batch, 0);
}

// With --overlap-moe-expert-parallel-comm the schedule runs one more warmup forward (Megatron's
// get_pp_rank_microbatches), so every steady-state forward and the backward after it, which then
// run as a pair, belong to different micro-batch chunks whose forward already ran: without it the
// last stage would pair a forward with its own backward.
TEST(MegatronRules, CombinedPipelineStepsPairIndependentWork) {
  auto pairs_are_independent = [](const std::vector<PipelineStep>& order) {
    for (size_t i = 0; i + 1 < order.size(); ++i) {
      if (!order[i].steady) continue;
      const PipelineStep& b = order[i + 1];
      bool done = false;
      for (size_t k = 0; k < i; ++k) done = done || (order[k].forward && order[k].chunk == b.chunk && order[k].micro_batch == b.micro_batch);
      if (!done) return false;
    }
    return true;
  };
  for (int pp : {2, 4})
    for (int chunks : {2, 3})
      for (int64_t micro : {int64_t(pp), int64_t(2 * pp)})
        for (int rank = 0; rank < pp; ++rank) {
          const auto order = pipeline_order(pp, rank, chunks, micro, 0, /*extra_warmup_forward=*/true);
          EXPECT_EQ(order.size(), size_t(2 * chunks * micro));
          EXPECT_TRUE(pairs_are_independent(order)) << "pp " << pp << " rank " << rank << " chunks " << chunks;
        }
  EXPECT_FALSE(pairs_are_independent(pipeline_order(2, 1, 2, 4)));  // the last stage, without the extra forward
  // Every forward in the warmup (PP 2, 4 chunks, 2 micro-batches on the first stage): no steady
  // state, so the last forward and the first backward do not pair (pairing them would wait for the
  // backward's gradient before sending the forward's activations, which the next stage needs first).
  const auto all_warmup = pipeline_order(2, 0, 4, 2, 0, true);
  for (const auto& step : all_warmup) EXPECT_FALSE(step.steady);
  const auto steady = pipeline_order(2, 1, 4, 2, 0, true);  // 7 warmup forwards, one pair, 7 backwards
  int pairs = 0;
  for (const auto& step : steady) pairs += step.steady;
  EXPECT_EQ(pairs, 1);
  EXPECT_TRUE(steady[7].steady && !steady[8].forward);
  // One stage: Megatron's combined 1F1B order without a pipeline, F0 | F1 B0 | F2 B1 | B2.
  const auto one = pipeline_order(1, 0, 1, 3, 0, true);
  ASSERT_EQ(one.size(), 6u);
  EXPECT_TRUE(one[0].forward && one[1].forward && !one[2].forward && one[3].forward && !one[4].forward && !one[5].forward);
  EXPECT_EQ(one[2].micro_batch, 0);
  EXPECT_EQ(one[3].micro_batch, 2);
}

}  // namespace fp8tron

namespace fp8tron {
using namespace fp8tron::testing;

// --cuda-graph-impl full_iteration, Megatron's older spellings of it, the per-layer graphs that
// warn, and what the full-iteration graph refuses, each in one line naming the flag.
TEST(MegatronRules, FullIterationCudaGraph) {
  auto on_gpu = [](std::vector<std::string> args, int world = 1) {
    LaunchEnv env;
    env.world_size = world;
    return build_config(parse(args), env, /*gpu_available=*/true);
  };
  auto graph = [](std::initializer_list<std::string> extra) {
    auto a = tiny_args({"--bf16", "--cuda-graph-impl", "full_iteration"});
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  };
  const Config c = on_gpu(graph({}));
  EXPECT_TRUE(c.training.cuda_graph.full_iteration);
  EXPECT_EQ(c.training.cuda_graph.warmup_steps, 3);  // Megatron's default
  EXPECT_EQ(on_gpu(graph({"--cuda-graph-warmup-steps", "1"})).training.cuda_graph.warmup_steps, 1);
  EXPECT_FALSE(on_gpu(tiny_args({"--bf16"})).training.cuda_graph.full_iteration);
  for (const auto& older : {tiny_args({"--bf16", "--enable-cuda-graph", "--cuda-graph-scope", "full_iteration"}),
                            tiny_args({"--bf16", "--cuda-graph-impl", "local", "--cuda-graph-scope", "full_iteration"})})
    EXPECT_TRUE(on_gpu(older).training.cuda_graph.full_iteration) << join(older, " ");
  // Per-layer graphs: every step runs eagerly, and one warning line says so.
  for (const auto& per_layer : {tiny_args({"--enable-cuda-graph"}),
                                tiny_args({"--cuda-graph-impl", "transformer_engine", "--cuda-graph-scope", "attn", "mlp"}),
                                tiny_args({"--cuda-graph-impl", "local", "--cuda-graph-modules", "attn"})}) {
    const Config p = on_gpu(per_layer);
    EXPECT_FALSE(p.training.cuda_graph.full_iteration);
    int lines = 0;
    for (const auto& w : p.hint_warnings)
      if (w.find("per-layer CUDA graphs") != std::string::npos) {
        ++lines;
        EXPECT_NE(w.find("every step runs eagerly"), std::string::npos) << w;
        EXPECT_EQ(w.find('\n'), std::string::npos) << w;
      }
    EXPECT_EQ(lines, 1) << join(per_layer, " ") << ": " << join(p.hint_warnings, "\n");
  }
  // The full-iteration scope without an implementation captures nothing, as in Megatron: one line
  // names the flag that would.
  {
    const Config p = on_gpu(tiny_args({"--cuda-graph-scope", "full_iteration"}));
    EXPECT_FALSE(p.training.cuda_graph.full_iteration);
    ASSERT_EQ(p.hint_warnings.size(), 1u) << join(p.hint_warnings, "\n");
    EXPECT_NE(p.hint_warnings[0].find("add --cuda-graph-impl full_iteration"), std::string::npos) << p.hint_warnings[0];
  }
  EXPECT_USER_ERROR(on_gpu(tiny_args({"--cuda-graph-scope", "everything"})), "--cuda-graph-scope everything: not a graph scope");
  EXPECT_USER_ERROR(on_gpu(graph({"--cuda-graph-warmup-steps", "0"})), "--cuda-graph-warmup-steps must be at least 1");
  EXPECT_USER_ERROR(build(graph({})), "--cuda-graph-impl full_iteration needs a GPU");
  EXPECT_USER_ERROR(on_gpu(graph({"--global-batch-size", "4"}), 2), "captures one GPU's step so far");
  EXPECT_USER_ERROR(on_gpu(graph({"--num-experts", "4"})), "mixture-of-experts");
  EXPECT_TRUE(on_gpu(graph({"--fp8-format", "hybrid"})).training.cuda_graph.full_iteration);
  EXPECT_USER_ERROR(on_gpu(graph({"--fp8-format", "hybrid", "--use-distributed-optimizer", "--fp8-param-gather"})),
                    "does not capture --fp8-param-gather");
  EXPECT_USER_ERROR(on_gpu(without(graph({"--fp16"}), "--bf16")), "needs a fixed loss scale");
  EXPECT_NO_THROW(on_gpu(without(graph({"--fp16", "--loss-scale", "1024"}), "--bf16")));
  EXPECT_USER_ERROR(on_gpu(graph({"--recompute-granularity", "full", "--recompute-method", "uniform",
                                  "--recompute-num-layers", "1"})),
                    "activation recomputation");
  EXPECT_USER_ERROR(on_gpu(graph({"--mtp-num-layers", "1"})), "multi-token prediction");
}

}  // namespace fp8tron
