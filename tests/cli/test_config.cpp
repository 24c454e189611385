#include <gtest/gtest.h>

#include <algorithm>
#include <csignal>
#include <cstdlib>
#include <map>
#include <set>
#include <sstream>

#include "core/error.h"
#include "data/loader/file_source.h"
#include "parallel/launch_env.h"
#include "tests/test_helpers.h"
#include "trainer/cli/arguments_json.h"
#include "trainer/cli/determinism_env.h"
#include "trainer/cli/dry_run.h"

namespace fp8tron {
using namespace fp8tron::testing;

TEST(Config, MegatronDefaults) {
  Config c = build(tiny_args());
  EXPECT_EQ(c.model.ffn_hidden_size, 4 * 32);
  EXPECT_EQ(c.model.kv_channels, 8);
  EXPECT_EQ(c.model.num_query_groups, 4);
  EXPECT_EQ(c.model.max_position_embeddings, 16);
  EXPECT_EQ(c.model.vocab_size, 65);          // NullTokenizer: vocab-size + EOD
  EXPECT_EQ(c.model.padded_vocab_size, 128);  // padded to a multiple of 128
  EXPECT_DOUBLE_EQ(c.model.hidden_dropout, 0.1);
  EXPECT_EQ(c.training.global_batch_size, 2);  // micro x dp
  EXPECT_EQ(c.training.num_micro_batches, 1);
  EXPECT_EQ(c.lr_schedule.decay_steps, 10 * 2);  // in samples
  EXPECT_EQ(c.precision.params_dtype, ParamDtype::Fp32);
  EXPECT_EQ(c.device, "cpu");
}

// --eval-micro-batch-size: Megatron's default is --micro-batch-size; the evaluation batch is cut
// into micro-batches of that many sequences per data-parallel rank.
TEST(Config, EvalMicroBatchSize) {
  Config c = build(tiny_args({"--global-batch-size", "8"}));
  EXPECT_EQ(c.training.eval_micro_batch_size, 2);
  EXPECT_EQ(c.training.eval_micro_batches, 4);
  c = build(tiny_args({"--global-batch-size", "8", "--eval-micro-batch-size", "4"}));
  EXPECT_EQ(c.training.eval_micro_batch_size, 4);
  EXPECT_EQ(c.training.eval_micro_batches, 2);
  EXPECT_EQ(c.training.num_micro_batches, 4);  // training keeps its own
  c = build(tiny_args({"--global-batch-size", "8", "--eval-micro-batch-size", "1", "--eval-global-batch-size", "6"}), 2);
  EXPECT_EQ(c.training.eval_micro_batches, 3);
  EXPECT_USER_ERROR(build(tiny_args({"--global-batch-size", "8", "--eval-micro-batch-size", "3"})),
                    "--eval-global-batch-size (8) must be a positive multiple of --eval-micro-batch-size (3) x "
                    "data-parallel size (1)");
  EXPECT_USER_ERROR(build(tiny_args({"--eval-micro-batch-size", "0"})), "--eval-micro-batch-size (0) must be positive");
  // The interleaved schedule's micro-batch rule holds for evaluation too (Megatron runs it there).
  EXPECT_USER_ERROR(build(tiny_args({"--num-layers", "4", "--pipeline-model-parallel-size", "2",
                                     "--num-layers-per-virtual-pipeline-stage", "1", "--global-batch-size", "8",
                                     "--eval-micro-batch-size", "8"}),
                          2),
                    "should range in [PP=2, M=1]");
}

// --eval-global-batch-size: Megatron's default is the global batch size; the evaluation runs its
// own count of micro-batches, and the validation and test splits are sized by it.
TEST(Config, EvalGlobalBatchSize) {
  Config c = build(tiny_args({"--global-batch-size", "4"}));
  EXPECT_EQ(c.training.eval_global_batch_size, 4);
  EXPECT_EQ(c.training.eval_micro_batches, 2);
  c = build(tiny_args({"--global-batch-size", "4", "--eval-global-batch-size", "10"}));
  EXPECT_EQ(c.training.eval_global_batch_size, 10);
  EXPECT_EQ(c.training.eval_micro_batches, 5);
  EXPECT_EQ(c.training.num_micro_batches, 2);  // training keeps its own
  EXPECT_USER_ERROR(build(tiny_args({"--eval-global-batch-size", "3"})),
                    "--eval-global-batch-size (3) must be a positive multiple of --micro-batch-size (2)");
  EXPECT_USER_ERROR(build(tiny_args({"--eval-global-batch-size", "0"})), "--eval-global-batch-size (0)");
  // 10 iterations, evaluations at 0, 5 and 10: three points of 2 iterations of 6 sequences.
  const auto sizes = megatron_split_samples(10, std::nullopt, 4, 6, 5, 2);
  EXPECT_EQ(sizes[0], 40);
  EXPECT_EQ(sizes[1], 3 * 2 * 6);
  EXPECT_EQ(sizes[2], 2 * 6);
}

TEST(Config, SwigluFfnAndGqa) {
  Config c = build(tiny_args({"--hidden-size", "96", "--num-attention-heads", "6", "--swiglu", "--group-query-attention",
                              "--num-query-groups", "2"}));
  EXPECT_EQ(c.model.ffn_hidden_size, 256);  // int(4*96*2/3 / 64) * 64
  EXPECT_EQ(c.model.num_query_groups, 2);
  EXPECT_EQ(build(tiny_args({"--num-query-groups", "2"})).model.num_query_groups, 4)
      << "--num-query-groups only counts with --group-query-attention";
}

// --no-bias-gelu-fusion is a real switch (the bf16 MLP as the unfused chain of ops instead of the fused GeLU MLP), not a hint.
TEST(Config, NoBiasGeluFusionReachesTheModel) {
  const Config on = build(tiny_args());
  const Config off = build(tiny_args({"--no-bias-gelu-fusion"}));
  EXPECT_TRUE(on.model.bias_gelu_fusion);
  EXPECT_FALSE(off.model.bias_gelu_fusion);
  EXPECT_EQ(off.hint_warnings.size(), on.hint_warnings.size()) << "warned as hint-only";
}

TEST(Config, VocabPaddingFollowsMegatron) {
  EXPECT_EQ(padded_vocab_size(50257, 128, 1), 50304);
  EXPECT_EQ(padded_vocab_size(50257, 128, 2), 50432);
  EXPECT_EQ(padded_vocab_size(50304, 128, 1), 50304);
  EXPECT_EQ(padded_vocab_size(32000, 128, 8), 32768);
}

TEST(Config, Bf16ForcesFp32Gradients) {
  EXPECT_TRUE(build(tiny_args({"--bf16"})).precision.grads_in_fp32);
  EXPECT_FALSE(build(tiny_args({"--fp16"})).precision.grads_in_fp32);
  EXPECT_TRUE(build(tiny_args({"--fp16", "--accumulate-allreduce-grads-in-fp32"})).precision.grads_in_fp32);
  EXPECT_TRUE(build(tiny_args({"--fp16"})).precision.dynamic_loss_scale());
  EXPECT_FALSE(build(tiny_args({"--fp16", "--loss-scale", "128"})).precision.dynamic_loss_scale());
}

TEST(Config, GradReduceInBf16KeepsBf16Gradients) {
  // Megatron: with --bf16, --grad-reduce-in-bf16 turns --accumulate-allreduce-grads-in-fp32 off,
  // even when given; other dtypes do not read it.
  EXPECT_FALSE(build(tiny_args({"--bf16", "--grad-reduce-in-bf16"})).precision.grads_in_fp32);
  const Config both = build(tiny_args({"--bf16", "--grad-reduce-in-bf16", "--accumulate-allreduce-grads-in-fp32"}));
  EXPECT_FALSE(both.precision.grads_in_fp32);
  ASSERT_EQ(both.hint_warnings.size(), 1u);
  EXPECT_NE(both.hint_warnings[0].find("--accumulate-allreduce-grads-in-fp32 has no effect with --grad-reduce-in-bf16"),
            std::string::npos);
  const Config fp16 = build(tiny_args({"--fp16", "--grad-reduce-in-bf16", "--accumulate-allreduce-grads-in-fp32"}));
  EXPECT_TRUE(fp16.precision.grads_in_fp32);
  EXPECT_NE(std::find(fp16.hint_warnings.begin(), fp16.hint_warnings.end(),
                      "--grad-reduce-in-bf16 has no effect without --bf16 (Megatron reads it only for bf16 runs)"),
            fp16.hint_warnings.end());
  EXPECT_TRUE(build(tiny_args({"--grad-reduce-in-bf16"})).precision.grads_in_fp32);
}

TEST(Config, InvalidCombinationsNameTheFlags) {
  EXPECT_USER_ERROR(build(tiny_args({"--bf16", "--fp16"})), "--bf16 and --fp16 cannot be used together");
  EXPECT_USER_ERROR(build(tiny_args({"--group-query-attention", "--num-query-groups", "3"})),
                    "--num-attention-heads (4) is not divisible by --num-query-groups (3)");
  EXPECT_USER_ERROR(build(tiny_args({"--global-batch-size", "5"})),
                    "--global-batch-size (5) is not divisible by --micro-batch-size (2) x data-parallel size (1)");
  EXPECT_USER_ERROR(build(tiny_args({"--global-batch-size", "6"}), 2),
                    "--global-batch-size (6) is not divisible by --micro-batch-size (2) x data-parallel size (2)");
  EXPECT_USER_ERROR(build(tiny_args({"--train-samples", "100"})), "--train-iters and --train-samples cannot be used together");
  EXPECT_USER_ERROR(build(tiny_args({"--hidden-size", "30"})), "--hidden-size (30) is not divisible by --num-attention-heads (4)");
  EXPECT_USER_ERROR(build(tiny_args({"--max-position-embeddings", "8"})), "--max-position-embeddings (8) is smaller than --seq-length (16)");
  EXPECT_USER_ERROR(build(tiny_args({"--lr-warmup-fraction", "0.1", "--lr-warmup-iters", "2"})),
                    "--lr-warmup-fraction and --lr-warmup-iters: give only one");
  EXPECT_USER_ERROR(build(tiny_args({"--lr-warmup-iters", "10"})), "warmup");
  EXPECT_USER_ERROR(build(tiny_args({"--min-lr", "1"})), "--min-lr is larger than --lr");
  EXPECT_USER_ERROR(build(tiny_args({"--lr-decay-style", "WSD"})), "--lr-wsd-decay-iters");
  EXPECT_USER_ERROR(build(tiny_args({"--loss-scale", "8"})), "--loss-scale needs --fp16");
  EXPECT_USER_ERROR(build(tiny_args({"--attention-dropout", "1.5"})), "--attention-dropout must be in [0, 1)");
  EXPECT_USER_ERROR(build(tiny_args({"--position-embedding-type", "rope", "--rotary-percent", "0.3"})), "--rotary-percent");
  EXPECT_USER_ERROR(build(tiny_args({"--tensor-model-parallel-size", "3"})), "world size 1 is not divisible");
  EXPECT_USER_ERROR(build(tiny_args({"--mock-data"})), "choose one data source");
  EXPECT_USER_ERROR(build(tiny_args({"--lr-decay-samples", "4"})), "with --train-iters use --lr-decay-iters");
}

TEST(Config, MissingRequiredFlags) {
  EXPECT_USER_ERROR(build({"--num-layers", "2", "--builtin-data", "--vocab-size", "64"}), "missing required flag --hidden-size");
  auto args = tiny_args();
  args.erase(args.begin() + 10, args.begin() + 12);  // drop --lr
  EXPECT_USER_ERROR(build(args), "--lr is required");
  args = tiny_args();
  args.pop_back();  // drop --builtin-data
  EXPECT_USER_ERROR(build(args), "no training data");
}

TEST(Config, DataFlags) {
  auto files = [](std::initializer_list<std::string> extra) {
    auto args = tiny_args(extra);
    args.erase(std::find(args.begin(), args.end(), "--builtin-data"));
    return args;
  };
  // pretrain_gpt.py's default tokenizer, GPT2BPETokenizer, needs its two files.
  EXPECT_USER_ERROR(build(files({"--data-path", "/data/x"})), "GPT2BPETokenizer (pretrain_gpt.py's default), which needs --vocab-file and --merge-file");
  EXPECT_USER_ERROR(build(files({"--data-path", "/data/x", "--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", "v",
                                 "--merge-file", "m"})),
                    "needs the trainer to build the tokenizer");
  EXPECT_NE(build(tiny_args({"--split", "90,10,0"})).hint_warnings.back().find("--split has no effect"), std::string::npos);
  EXPECT_USER_ERROR(build(files({"--data-path", "a", "--valid-data-path", "b", "--tokenizer-type", "NullTokenizer"})),
                    "cannot be combined");
  Config c = build(files({"--data-path", "0.3", "a", "0.7", "b", "--tokenizer-type", "NullTokenizer", "--split", "98,2,0",
                          "--eod-mask-loss", "--reset-position-ids"}));
  EXPECT_EQ(c.data.source, DataSource::Files);
  EXPECT_EQ(c.data.split, "98,2,0");
  EXPECT_EQ(c.data.eod, 63);              // NullTokenizer (Megatron-LM d98e8a6): eod = --vocab-size - 1
  EXPECT_EQ(c.model.vocab_size, 64);
  EXPECT_EQ(c.notices.front(), "Overriding default arguments for tokenizer_type:GPT2BPETokenizer with tokenizer_type:NullTokenizer");
  EXPECT_TRUE(c.data.eod_mask_loss && c.data.reset_position_ids);
  // A real tokenizer decides the vocabulary through the resolver the trainer passes.
  LaunchEnv env;
  Config g = build_config(parse(files({"--data-path", "a", "--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", "v.json",
                                       "--merge-file", "m.txt"})),
                          env, false, [](const DataConfig& d) {
                            EXPECT_EQ(d.vocab_file, "v.json");
                            return TokenizerInfo{50257, 50256};
                          });
  EXPECT_EQ(g.model.padded_vocab_size, 50304);
  EXPECT_EQ(g.data.eod, 50256);
}

// --fim-data: Megatron's defaults, its refusals (mock data, a split token without a fragment
// rate, a tokenizer that cannot detokenize), and the tokenizer's warnings passed on.
TEST(Config, FimDataFlags) {
  auto gpt2 = [](std::initializer_list<std::string> extra) {
    auto args = tiny_args({"--data-path", "a", "--vocab-file", "v.json", "--merge-file", "m.txt", "--fim-data"});
    args.erase(std::find(args.begin(), args.end(), "--builtin-data"));
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  };
  LaunchEnv env;
  auto with_tokenizer = [&](const std::vector<std::string>& args) {
    return build_config(parse(args), env, false, [](const DataConfig& d) {
      TokenizerInfo info{50257, 50256};
      if (d.fim.enabled) info.warnings.push_back("fim token warning");
      return info;
    });
  };
  Config c = with_tokenizer(gpt2({}));
  EXPECT_TRUE(c.data.fim.enabled);
  EXPECT_DOUBLE_EQ(c.data.fim.rate, 0.5);
  EXPECT_DOUBLE_EQ(c.data.fim.spm_rate, 0.5);
  EXPECT_FALSE(c.data.fim.split_sample || c.data.fim.fragment_rate || c.data.fim.no_prefix);
  EXPECT_EQ(c.data.fim.prefix_token, "<fim_prefix>");
  EXPECT_EQ(c.data.fim.middle_token, "<fim_middle>");
  EXPECT_EQ(c.data.fim.suffix_token, "<fim_suffix>");
  EXPECT_EQ(c.data.fim.pad_token, "<fim_pad>");
  EXPECT_EQ(c.data.fim.eod_token, "<|endoftext|>");
  EXPECT_NE(std::find(c.hint_warnings.begin(), c.hint_warnings.end(), "fim token warning"), c.hint_warnings.end());
  c = with_tokenizer(gpt2({"--fim-rate", "0.9", "--fim-spm-rate", "0.1", "--fim-split-sample", "<file_sep>",
                           "--fim-fragment-rate", "0.3", "--fim-no-prefix", "<repo>", "--fim-pad-token", "<pad>"}));
  EXPECT_DOUBLE_EQ(c.data.fim.rate, 0.9);
  EXPECT_EQ(c.data.fim.split_sample, "<file_sep>");
  EXPECT_EQ(c.data.fim.fragment_rate, 0.3);
  EXPECT_EQ(c.data.fim.no_prefix, "<repo>");
  EXPECT_EQ(c.data.fim.pad_token, "<pad>");
  EXPECT_USER_ERROR(with_tokenizer(gpt2({"--fim-split-sample", "<file_sep>"})),
                    "--fim-split-sample needs --fim-fragment-rate");
  EXPECT_USER_ERROR(with_tokenizer(gpt2({"--fim-rate", "1.5"})), "--fim-rate 1.5 is not a probability");
  EXPECT_USER_ERROR(build(tiny_args({"--fim-data"})), "pass --data-path instead of --builtin-data");
  auto mock = tiny_args({"--fim-data", "--mock-data"});
  mock.erase(std::find(mock.begin(), mock.end(), "--builtin-data"));
  EXPECT_USER_ERROR(build(mock), "--fim-data does not work with --mock-data");
  EXPECT_USER_ERROR(with_tokenizer(gpt2({"--tokenizer-type", "SentencePieceTokenizer", "--tokenizer-model", "t.model"})),
                    "GPT2BPETokenizer, HuggingFaceTokenizer or TikTokenizer");
  // Without --fim-data the other FIM flags do nothing: one warning names them.
  Config off = build(tiny_args({"--fim-rate", "0.2", "--fim-no-prefix", "x"}));
  EXPECT_FALSE(off.data.fim.enabled);
  EXPECT_NE(off.hint_warnings.back().find("--fim-rate, --fim-no-prefix have no effect without --fim-data"), std::string::npos);
}

TEST(Config, TrainSamplesConvertsToIterations) {
  auto args = tiny_args({"--global-batch-size", "4", "--train-samples", "40", "--lr-warmup-samples", "8"});
  args.erase(std::find(args.begin(), args.end(), "--train-iters"), std::find(args.begin(), args.end(), "--train-iters") + 2);
  Config c = build(args);
  EXPECT_EQ(c.training.train_iters, 10);
  EXPECT_EQ(c.lr_schedule.decay_steps, 40);
  EXPECT_EQ(c.lr_schedule.warmup_steps, 8);
}

TEST(Config, SupportLevels) {
  // Planned features are recorded (training refuses them); their defaults are harmless.
  Config c = build(tiny_args({"--tensor-model-parallel-size", "1", "--optimizer-cpu-offload"}));
  ASSERT_EQ(c.not_supported_yet.size(), 1u);
  EXPECT_NE(c.not_supported_yet[0].find("--optimizer-cpu-offload"), std::string::npos);
  // Data parallelism is there.
  EXPECT_TRUE(build(tiny_args({"--global-batch-size", "4"}), 2).not_supported_yet.empty());
  // Overlapped data-parallel communication, with Megatron's rules for the parameter all-gather.
  Config overlapped = build(tiny_args({"--overlap-grad-reduce", "--use-distributed-optimizer", "--overlap-param-gather"}));
  EXPECT_TRUE(overlapped.not_supported_yet.empty());
  EXPECT_TRUE(overlapped.distributed.overlap_grad_reduce && overlapped.distributed.overlap_param_gather);
  EXPECT_USER_ERROR(build(tiny_args({"--overlap-param-gather", "--overlap-grad-reduce"})),
                    "--overlap-param-gather is only supported with --use-distributed-optimizer");
  EXPECT_USER_ERROR(build(tiny_args({"--overlap-param-gather", "--use-distributed-optimizer"})),
                    "--overlap-param-gather needs --overlap-grad-reduce");
  // Hint-only flags warn; math-changing flags we do not implement fail naming the flag.
  EXPECT_EQ(build(tiny_args({"--no-masked-softmax-fusion"})).hint_warnings.size(), 1u);
  EXPECT_USER_ERROR(build(tiny_args({"--openai-gelu"})), "--openai-gelu is not supported by fp8tron");
}

TEST(Config, DistributedOptimizerInstances) {
  // Megatron's partial distributed optimizer: N copies over dp x cp (and the expert data-parallel
  // ranks) split evenly; one instance is the default.
  auto args = [](std::initializer_list<std::string> extra) {
    std::vector<std::string> a = tiny_args({"--global-batch-size", "8"});
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  };
  EXPECT_EQ(build(args({"--use-distributed-optimizer"}), 4).distributed.optimizer_instances, 1);
  const Config two = build(args({"--use-distributed-optimizer", "--num-distributed-optimizer-instances", "2"}), 4);
  EXPECT_EQ(two.distributed.optimizer_instances, 2);
  EXPECT_TRUE(two.not_supported_yet.empty());
  // dp x cp counts: CP2 x DP2 splits into 4.
  EXPECT_EQ(build(args({"--use-distributed-optimizer", "--num-distributed-optimizer-instances", "4",
                        "--context-parallel-size", "2", "--global-batch-size", "4"}),
                  4)
                .distributed.optimizer_instances,
            4);
  EXPECT_USER_ERROR(build(args({"--num-distributed-optimizer-instances", "2"}), 4),
                    "--num-distributed-optimizer-instances 2 needs --use-distributed-optimizer");
  EXPECT_USER_ERROR(build(args({"--use-distributed-optimizer", "--num-distributed-optimizer-instances", "3"}), 4),
                    "--num-distributed-optimizer-instances 3 must divide the data-parallel size x "
                    "--context-parallel-size (4)");
  EXPECT_USER_ERROR(build(args({"--use-distributed-optimizer", "--num-distributed-optimizer-instances", "0"}), 4),
                    "--num-distributed-optimizer-instances must be at least 1");
  // The experts' data-parallel ranks split too: DP4 x EP4 leaves one expert replica.
  EXPECT_USER_ERROR(build(args({"--use-distributed-optimizer", "--num-distributed-optimizer-instances", "2",
                                "--num-experts", "4", "--expert-model-parallel-size", "4"}),
                          4),
                    "must divide the expert data-parallel size (1)");
  EXPECT_USER_ERROR(build(args({"--use-distributed-optimizer", "--num-distributed-optimizer-instances", "2",
                                "--optimizer", "muon"}),
                          4),
                    "is not supported with --optimizer muon and --use-distributed-optimizer");
}

TEST(Config, WandbFlags) {
  // As Megatron's _set_wandb_writer: on with --wandb-project; the files under <--save>/wandb unless
  // --wandb-save-dir says where.
  Config c = build(tiny_args({"--wandb-project", "p", "--save", "/ckpt", "--wandb-entity", "team"}));
  EXPECT_TRUE(c.logging.wandb.enabled());
  EXPECT_EQ(c.logging.wandb.save_dir, "/ckpt/wandb");
  EXPECT_EQ(c.logging.wandb.entity, "team");
  EXPECT_EQ(c.logging.wandb.exp_name, "");
  EXPECT_EQ(build(tiny_args({"--wandb-project", "p", "--save", "/ckpt", "--wandb-save-dir", "/w"})).logging.wandb.save_dir, "/w");
  EXPECT_FALSE(build(tiny_args({})).logging.wandb.enabled());
  EXPECT_USER_ERROR(build(tiny_args({"--wandb-project", "p"})), "give --wandb-save-dir, or --save");
  EXPECT_USER_ERROR(build(tiny_args({"--wandb-project", "p", "--save", "/c", "--wandb-exp-name", ""})),
                    "--wandb-exp-name was given an empty value");
  const auto warnings = build(tiny_args({"--wandb-exp-name", "run", "--wandb-save-dir", "/w"})).hint_warnings;
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_EQ(warnings[0], "--wandb-exp-name, --wandb-save-dir have no effect without --wandb-project (W&B logging is off)");
  // The TensorBoard flags W&B follows too are not inert with W&B alone; memory and perplexity are.
  const auto wandb_only = build(tiny_args({"--wandb-project", "p", "--save", "/c", "--log-timers-to-tensorboard",
                                           "--tensorboard-log-interval", "5", "--log-memory-to-tensorboard"}))
                              .hint_warnings;
  ASSERT_EQ(wandb_only.size(), 1u);
  EXPECT_EQ(wandb_only[0], "--log-memory-to-tensorboard has no effect without --tensorboard-dir");
}

TEST(Config, ArgumentsAsTypedJson) {
  // The W&B run's config: Megatron's argument names with typed values, as vars(args).
  const auto args = arguments_json(build(tiny_args({"--global-batch-size", "4", "--iterations-to-skip", "3", "5"}), 2));
  EXPECT_EQ(args.at("hidden_size"), 32);
  EXPECT_EQ(args.at("lr"), 1e-3);
  EXPECT_EQ(args.at("builtin_data"), true);
  EXPECT_EQ(args.at("bf16"), false);
  EXPECT_TRUE(args.at("save").is_null());
  EXPECT_EQ(args.at("iterations_to_skip"), nlohmann::json::array({3, 5}));
  EXPECT_EQ(args.at("profile_ranks"), nlohmann::json::array({0}));  // a default list
  EXPECT_EQ(args.at("moe_aux_loss_coeff"), nlohmann::json::array({0.0}));
  EXPECT_EQ(args.at("world_size"), 2);
  EXPECT_EQ(args.at("data_parallel_size"), 2);
  EXPECT_EQ(args.at("padded_vocab_size"), 128);
}

TEST(Config, ExpertParallelismNeedsExperts) {
  // As Megatron: expert parallelism splits a mixture-of-experts model's experts.
  EXPECT_USER_ERROR(build(tiny_args({"--expert-model-parallel-size", "2", "--global-batch-size", "4"}), 2),
                    "--expert-model-parallel-size 2 needs --num-experts");
  // With experts the layout is valid and trains.
  Config c = build(tiny_args({"--expert-model-parallel-size", "2", "--num-experts", "4", "--global-batch-size", "4"}), 2);
  EXPECT_EQ(c.parallel.ep, 2);
  EXPECT_EQ(c.parallel.edp, 1);
  EXPECT_TRUE(c.not_supported_yet.empty());
  EXPECT_USER_ERROR(build(tiny_args({"--expert-model-parallel-size", "4", "--num-experts", "6", "--global-batch-size", "8"}), 4),
                    "--num-experts (6) is not divisible by --expert-model-parallel-size (4)");
}

TEST(Config, CheckpointFlags) {
  Config c = build(tiny_args({"--save", "/tmp/a", "--load", "/tmp/b", "--save-interval", "50", "--no-save-optim",
                              "--no-load-rng", "--finetune", "--exit-signal-handler", "--exit-signal", "SIGUSR1",
                              "--ckpt-step", "100"}));
  EXPECT_TRUE(c.not_supported_yet.empty());
  EXPECT_EQ(c.checkpoint.save, "/tmp/a");
  EXPECT_EQ(c.checkpoint.load, "/tmp/b");
  EXPECT_EQ(c.checkpoint.save_interval, 50);
  EXPECT_FALSE(c.checkpoint.save_optim);
  EXPECT_TRUE(c.checkpoint.save_rng);
  EXPECT_TRUE(c.checkpoint.load_optim);
  EXPECT_FALSE(c.checkpoint.load_rng);
  EXPECT_TRUE(c.checkpoint.finetune);
  EXPECT_TRUE(c.checkpoint.exit_signal_handler);
  EXPECT_EQ(c.checkpoint.exit_signal, SIGUSR1);
  EXPECT_EQ(c.checkpoint.ckpt_step, 100);
  EXPECT_EQ(build(tiny_args()).checkpoint.exit_signal, SIGTERM);
  // Megatron's formats choose which of its checkpoints --load reads; saves are in fp8tron's own
  // format unless --ckpt-format torch_dist is given explicitly with --save (Megatron's format);
  // for the other values a notice says so.
  const Config torch_format = build(tiny_args({"--ckpt-format", "torch"}));
  EXPECT_EQ(torch_format.checkpoint.ckpt_format, "torch");
  EXPECT_TRUE(torch_format.hint_warnings.empty());
  EXPECT_EQ(build(tiny_args()).checkpoint.ckpt_format, "torch_dist");
  EXPECT_FALSE(build(tiny_args()).checkpoint.auto_detect_ckpt_format);
  EXPECT_TRUE(build(tiny_args({"--auto-detect-ckpt-format"})).checkpoint.auto_detect_ckpt_format);
  auto notices = build(tiny_args({"--ckpt-format", "torch", "--save", "/tmp/fp8tron-unused"})).hint_warnings;
  ASSERT_EQ(notices.size(), 1u);
  EXPECT_NE(notices[0].find("fp8tron writes its own checkpoint format"), std::string::npos);
  const Config torch_dist = build(tiny_args({"--ckpt-format", "torch_dist", "--save", "/tmp/fp8tron-unused"}));
  EXPECT_TRUE(torch_dist.checkpoint.save_torch_dist);
  EXPECT_TRUE(torch_dist.hint_warnings.empty());
  EXPECT_FALSE(build(tiny_args({"--save", "/tmp/fp8tron-unused"})).checkpoint.save_torch_dist);
  const Config convert = build(tiny_args({"--load", "/tmp/fp8tron-in", "--ckpt-convert-format", "torch_dist",
                                          "--ckpt-convert-save", "/tmp/fp8tron-out"}));
  EXPECT_EQ(convert.checkpoint.save, "/tmp/fp8tron-out/torch_dist");
  EXPECT_TRUE(convert.checkpoint.save_torch_dist);
  EXPECT_USER_ERROR(build(tiny_args({"--ckpt-convert-format", "torch_dist", "--ckpt-convert-save", "/tmp/x"})),
                    "--ckpt-convert-format needs --load");
  EXPECT_USER_ERROR(build(tiny_args({"--ckpt-format", "zarr2"})), "--ckpt-format");
  EXPECT_USER_ERROR(build(tiny_args({"--save-interval", "0"})), "--save-interval must be positive");
  EXPECT_USER_ERROR(build(tiny_args({"--exit-signal", "SIGKILL"})), "cannot be caught");
  EXPECT_TRUE(build(tiny_args({"--async-save"})).checkpoint.async_save);
  // Megatron's second name for --save-interval.
  EXPECT_EQ(build(tiny_args({"--persistent-save-interval", "30"})).checkpoint.save_interval, 30);
  EXPECT_EQ(build(tiny_args({"--persistent-save-interval", "30", "--save-interval", "30"})).checkpoint.save_interval, 30);
  EXPECT_USER_ERROR(build(tiny_args({"--persistent-save-interval", "30", "--save-interval", "20"})), "name the same setting");
  EXPECT_EQ(build(tiny_args({"--save-retain-interval", "1000"})).checkpoint.save_retain_interval, 1000);
  EXPECT_USER_ERROR(build(tiny_args({"--save-retain-interval", "0"})), "--save-retain-interval must be positive");
  // Non-persistent checkpoints: global only.
  Config np = build(tiny_args({"--non-persistent-save-interval", "5", "--non-persistent-ckpt-type", "global",
                               "--non-persistent-global-ckpt-dir", "/tmp/np"}));
  EXPECT_TRUE(np.not_supported_yet.empty());
  EXPECT_EQ(np.checkpoint.non_persistent_save_interval, 5);
  EXPECT_TRUE(np.checkpoint.non_persistent_global);
  EXPECT_EQ(np.checkpoint.non_persistent_dir, "/tmp/np");
  EXPECT_USER_ERROR(build(tiny_args({"--non-persistent-save-interval", "5"})), "needs --non-persistent-ckpt-type global");
  EXPECT_USER_ERROR(build(tiny_args({"--save", "/tmp/c", "--non-persistent-ckpt-type", "global",
                                     "--non-persistent-global-ckpt-dir", "/tmp/c/"})),
                    "--non-persistent-global-ckpt-dir must differ from --save and --load");
  EXPECT_USER_ERROR(build(tiny_args({"--non-persistent-ckpt-type", "local"})), "only global non-persistent checkpoints");
  EXPECT_USER_ERROR(build(tiny_args({"--non-persistent-ckpt-type", "in_memory"})), "only global non-persistent");
  // Fully parallel saves are Megatron's default.
  EXPECT_TRUE(build(tiny_args()).checkpoint.fully_parallel_save);
  EXPECT_FALSE(build(tiny_args({"--no-ckpt-fully-parallel-save"})).checkpoint.fully_parallel_save);
  EXPECT_EQ(build(tiny_args()).checkpoint.dist_ckpt_strictness, "assume_ok_unexpected");
  EXPECT_EQ(build(tiny_args({"--dist-ckpt-strictness", "log_all"})).checkpoint.dist_ckpt_strictness, "log_all");
  EXPECT_USER_ERROR(build(tiny_args({"--dist-ckpt-strictness", "lenient"})), "--dist-ckpt-strictness");
  // Megatron's own async/fully-parallel-load knobs are accepted with a notice.
  Config hints = build(tiny_args({"--ckpt-fully-parallel-load", "--async-strategy", "mcore", "--ckpt-fully-parallel-save"}));
  EXPECT_TRUE(hints.not_supported_yet.empty());
  EXPECT_EQ(hints.hint_warnings.size(), 3u);
}

TEST(Config, DeterministicMode) {
  EXPECT_FALSE(build(tiny_args()).training.deterministic);
  const Config c = build(tiny_args({"--deterministic-mode"}));
  EXPECT_TRUE(c.training.deterministic);
  EXPECT_TRUE(c.hint_warnings.empty());
  EXPECT_TRUE(c.not_supported_yet.empty());
}

TEST(DeterministicEnvironment, SetsWhatIsUnsetKeepsAcceptedValuesRefusesOthers) {
  std::map<std::string, std::string> env;
  auto lookup = [&env](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  };
  auto value = [](const std::vector<EnvSetting>& settings, const std::string& name) {
    for (const auto& s : settings)
      if (s.name == name) return s.value + (s.already_set ? " kept" : " set");
    return std::string("missing");
  };
  auto fresh = deterministic_environment(lookup);
  EXPECT_EQ(value(fresh, "CUBLAS_WORKSPACE_CONFIG"), ":4096:8 set");
  EXPECT_EQ(value(fresh, "NCCL_ALGO"), "Ring set");
  EXPECT_EQ(value(fresh, "FP8TRON_GEMM_AUTOTUNE"), "0 set");
  env = {{"CUBLAS_WORKSPACE_CONFIG", ":16:8"}, {"NCCL_ALGO", "Tree"}, {"FP8TRON_GEMM_AUTOTUNE", "0"}};
  auto given = deterministic_environment(lookup);
  EXPECT_EQ(value(given, "CUBLAS_WORKSPACE_CONFIG"), ":16:8 kept");
  EXPECT_EQ(value(given, "NCCL_ALGO"), "Tree kept");
  EXPECT_EQ(value(given, "FP8TRON_GEMM_AUTOTUNE"), "0 kept");
  env["NCCL_ALGO"] = "NVLS";
  EXPECT_USER_ERROR(deterministic_environment(lookup), "NCCL_ALGO=NVLS is not one of");
  env["NCCL_ALGO"] = "^NVLS";
  env["CUBLAS_WORKSPACE_CONFIG"] = ":0:0";
  EXPECT_USER_ERROR(deterministic_environment(lookup), "CUBLAS_WORKSPACE_CONFIG=:0:0");
  env["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8";
  env["FP8TRON_GEMM_AUTOTUNE"] = "1";
  EXPECT_USER_ERROR(deterministic_environment(lookup), "FP8TRON_GEMM_AUTOTUNE=1");
}

TEST(DeterministicEnvironment, ValidationRefusesABadEnvironmentForGpuRuns) {
  const char* previous = std::getenv("NCCL_ALGO");
  const std::string saved = previous ? previous : "";
  setenv("NCCL_ALGO", "NVLS", 1);
  // A dry run plans for the GPU without one; the environment is checked all the same.
  EXPECT_USER_ERROR(build(tiny_args({"--deterministic-mode", "--dry-run", "--device", "cuda"})),
                    "invalid configuration (deterministic mode environment): --deterministic-mode: NCCL_ALGO=NVLS");
  EXPECT_NO_THROW(build(tiny_args({"--deterministic-mode", "--device", "cpu"})));  // no NCCL, no cuBLAS
  if (previous) setenv("NCCL_ALGO", saved.c_str(), 1); else unsetenv("NCCL_ALGO");
}

TEST(Config, ParallelFlags) {
  Config c = build(tiny_args({"--num-layers", "8", "--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2",
                              "--num-layers-per-virtual-pipeline-stage", "2", "--sequence-parallel", "--use-distributed-optimizer",
                              "--global-batch-size", "8"}),
                   8);
  EXPECT_EQ(c.parallel.dp, 2);
  EXPECT_EQ(c.distributed.virtual_stages, 2);
  EXPECT_TRUE(c.distributed.sequence_parallel);
  EXPECT_TRUE(c.distributed.distributed_optimizer);
  EXPECT_FALSE(build(tiny_args({"--sequence-parallel"})).distributed.sequence_parallel) << "SP needs TP > 1";
  EXPECT_USER_ERROR(build(tiny_args({"--num-layers", "3", "--pipeline-model-parallel-size", "2"}), 2),
                    "--num-layers (3) is not divisible by the 2 pipeline stages");
  EXPECT_USER_ERROR(build(tiny_args({"--num-layers", "8", "--pipeline-model-parallel-size", "2",
                                     "--num-layers-per-virtual-pipeline-stage", "2"}), 2),
                    "micro-batches in a virtual pipeline stage should range in [PP=2, M=1]");
  EXPECT_USER_ERROR(build(tiny_args({"--num-layers-per-virtual-pipeline-stage", "1"})), "needs --pipeline-model-parallel-size > 1");
  EXPECT_EQ(build(tiny_args({"--num-layers", "5", "--pipeline-model-parallel-size", "2", "--decoder-first-pipeline-num-layers", "2"}), 2)
                .distributed.first_stage_layers.value_or(0), 2);
  EXPECT_USER_ERROR(build(tiny_args({"--tensor-model-parallel-size", "2", "--sequence-parallel", "--seq-length", "15"}), 2),
                    "is not divisible by --tensor-model-parallel-size (2) as --sequence-parallel needs");
}

// Megatron's rules for --overlap-param-gather-with-optimizer-step, and fp8tron's refusals.
TEST(Config, OverlapParamGatherWithOptimizerStep) {
  const std::vector<std::string> ok = tiny_args({"--num-layers", "8", "--pipeline-model-parallel-size", "2",
                                                 "--num-layers-per-virtual-pipeline-stage", "2", "--global-batch-size", "8",
                                                 "--use-distributed-optimizer", "--overlap-grad-reduce", "--overlap-param-gather",
                                                 "--ckpt-format", "torch", "--overlap-param-gather-with-optimizer-step"});
  const Config c = build(ok, 4);
  EXPECT_TRUE(c.distributed.overlap_param_gather_with_optimizer_step);
  EXPECT_TRUE(c.not_supported_yet.empty());
  auto without = [&](const std::string& flag) {
    std::vector<std::string> args;
    for (size_t i = 0; i < ok.size(); ++i) {
      if (ok[i] == flag) {
        if (flag == "--num-layers-per-virtual-pipeline-stage" || flag == "--ckpt-format") ++i;
        continue;
      }
      args.push_back(ok[i]);
    }
    return args;
  };
  EXPECT_USER_ERROR(build(without("--use-distributed-optimizer"), 4),
                    "--overlap-param-gather is only supported with --use-distributed-optimizer");
  EXPECT_USER_ERROR(build(without("--overlap-param-gather"), 4),
                    "Must use --overlap-param-gather-with-optimizer-step with --overlap-param-gather");
  EXPECT_USER_ERROR(build(without("--num-layers-per-virtual-pipeline-stage"), 4),
                    "--overlap-param-gather-with-optimizer-step only supported with interleaved pipeline parallelism");
  EXPECT_USER_ERROR(build(without("--ckpt-format"), 4),
                    "--overlap-param-gather-with-optimizer-step not supported with distributed checkpointing yet");
  EXPECT_USER_ERROR(build(with(ok, {"--optimizer", "muon"}), 4),
                    "--overlap-param-gather-with-optimizer-step is not supported with --optimizer muon");
  EXPECT_USER_ERROR(build(with(ok, {"--fp8-format", "hybrid", "--fp8-param-gather"}), 4),
                    "--overlap-param-gather-with-optimizer-step with --fp8-param-gather is not supported yet");
}

TEST(Config, DryRunPlanForALargeJob) {
  auto args = tiny_args({"--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2",
                         "--global-batch-size", "500", "--dry-run"});
  Config c = build(args, 1000);
  EXPECT_EQ(c.parallel.dp, 250);
  std::string plan = format_plan(c);
  EXPECT_NE(plan.find("world 1000 = TP 2 x CP 1 x DP 250 x PP 2"), std::string::npos) << plan;
  EXPECT_NE(format_arguments(c).find("  num_layers "), std::string::npos);
}

// Megatron prints one line per argument, with a --no- switch's destination on by default.
TEST(Config, ArgumentTablePrintsEachArgumentOnceWithItsEffectiveValue) {
  auto line_of = [](const std::string& table, const std::string& key) {
    const size_t at = table.find("  " + key + " ");
    if (at == std::string::npos) return std::string();
    return table.substr(at, table.find('\n', at) - at);
  };
  const std::string table = format_arguments(build(tiny_args({"--override-opt_param-scheduler"})));
  EXPECT_NE(line_of(table, "check_for_nan_in_loss_and_grad").find(" true"), std::string::npos) << table;
  EXPECT_EQ(line_of(table, "no_check_for_nan_in_loss_and_grad"), "") << table;
  EXPECT_NE(line_of(table, "override_opt_param_scheduler").find(" true"), std::string::npos) << table;
  std::set<std::string> keys;
  std::istringstream lines(table);
  for (std::string line; std::getline(lines, line);)
    if (line.rfind("  ", 0) == 0) EXPECT_TRUE(keys.insert(line.substr(2, line.find(' ', 2) - 2)).second) << line;
  const std::string off = format_arguments(build(tiny_args({"--no-check-for-nan-in-loss-and-grad"})));
  EXPECT_NE(line_of(off, "check_for_nan_in_loss_and_grad").find(" false"), std::string::npos) << off;
}

// Values Megatron would refuse or that would fail far from their cause.
TEST(Config, RefusesWeightsAndTokenIdsOutOfRange) {
  EXPECT_USER_ERROR(build(tiny_args({"--init-method-std", "-1"})), "--init-method-std must be positive");
  EXPECT_USER_ERROR(build(tiny_args({"--init-method-std", "0"})), "--init-method-std must be positive");
  std::vector<std::string> mock = {"--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4",
                                   "--seq-length", "16", "--micro-batch-size", "2", "--lr", "1e-3", "--train-iters", "10",
                                   "--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", "1024"};
  EXPECT_USER_ERROR(build(with(mock, {"--null-tokenizer-eod-id", "5000"})),
                    "--null-tokenizer-eod-id 5000 is outside the vocabulary");
  EXPECT_EQ(build(with(mock, {"--null-tokenizer-eod-id", "7"})).data.null_eod_id.value_or(0), 7);
}

TEST(LaunchEnv, ReadsEachLauncher) {
  auto clear = [] {
    for (const char* v : {"WORLD_SIZE", "RANK", "LOCAL_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK",
                          "SLURM_NTASKS", "SLURM_PROCID", "TORCHELASTIC_USE_AGENT_STORE"})
      unsetenv(v);
  };
  clear();
  EXPECT_EQ(read_launch_env().world_size, 1);
  setenv("OMPI_COMM_WORLD_SIZE", "8", 1);
  setenv("OMPI_COMM_WORLD_RANK", "3", 1);
  EXPECT_EQ(read_launch_env().launcher, "mpirun");
  EXPECT_EQ(read_launch_env().rank, 3);
  clear();
  setenv("SLURM_NTASKS", "16", 1);
  setenv("SLURM_PROCID", "15", 1);
  EXPECT_EQ(read_launch_env().world_size, 16);
  clear();
  setenv("WORLD_SIZE", "4", 1);
  setenv("RANK", "1", 1);
  setenv("TORCHELASTIC_USE_AGENT_STORE", "True", 1);
  LaunchEnv e = read_launch_env();
  EXPECT_EQ(e.launcher, "torchrun");
  EXPECT_TRUE(e.agent_store);
  setenv("RANK", "4", 1);
  EXPECT_USER_ERROR(read_launch_env(), "rank 4 is not below world size 4");
  clear();
  setenv("WORLD_SIZE", "1024", 1);  // a dry run for a planned job
  EXPECT_EQ(read_launch_env().world_size, 1024);
  clear();
}

// Megatron-FSDP: each --data-parallel-sharding-strategy maps onto the data-parallel machinery
// (optim_grads_params, the default, also shards the weights); --use-torch-fsdp2 runs as
// optim_grads_params under Megatron's FSDP2 rules; what does not compose is refused by name.
TEST(Config, MegatronFsdpStrategies) {
  auto fsdp = [](std::initializer_list<std::string> extra, int world = 2) {
    return build(with(tiny_args({"--use-megatron-fsdp"}), extra), world).distributed;
  };
  DistributedConfig d = fsdp({});
  EXPECT_EQ(d.dp_sharding, DataParallelSharding::OptimGradsParams);
  EXPECT_TRUE(d.distributed_optimizer && d.shard_params() && d.shard_grads() && !d.all_reduce_sharded_grads());
  d = fsdp({"--data-parallel-sharding-strategy", "no_shard", "--use-distributed-optimizer"});
  EXPECT_FALSE(d.distributed_optimizer || d.shard_params() || d.shard_grads());
  d = fsdp({"--data-parallel-sharding-strategy", "optim"});
  EXPECT_TRUE(d.distributed_optimizer && d.all_reduce_sharded_grads() && !d.shard_params() && !d.shard_grads());
  d = fsdp({"--data-parallel-sharding-strategy", "optim_grads"});
  EXPECT_TRUE(d.distributed_optimizer && !d.all_reduce_sharded_grads() && !d.shard_params() && d.shard_grads());
  // The flags of Megatron's own FSDP test configurations.
  d = fsdp({"--data-parallel-sharding-strategy", "optim_grads_params", "--use-distributed-optimizer", "--bf16",
            "--no-gradient-accumulation-fusion", "--megatron-fsdp-main-params-dtype", "fp32",
            "--megatron-fsdp-main-grads-dtype", "fp32", "--megatron-fsdp-grad-comm-dtype", "fp32", "--ckpt-format",
            "fsdp_dtensor", "--outer-dp-sharding-strategy", "no_shard", "--num-distributed-optimizer-instances", "1",
            "--overlap-grad-reduce", "--overlap-param-gather"});
  EXPECT_TRUE(d.shard_params() && d.overlap_param_gather);
  d = build(tiny_args({"--use-torch-fsdp2", "--untie-embeddings-and-output-weights", "--no-gradient-accumulation-fusion"}), 2)
          .distributed;
  EXPECT_TRUE(d.shard_params() && d.distributed_optimizer);

  EXPECT_USER_ERROR(build(tiny_args({"--data-parallel-sharding-strategy", "optim"}), 2), "need --use-megatron-fsdp");
  EXPECT_USER_ERROR(fsdp({"--torch-fsdp2-no-reshard-after-forward"}), "--torch-fsdp2-no-reshard-after-forward needs --use-torch-fsdp2");
  EXPECT_TRUE(build(tiny_args({"--use-torch-fsdp2", "--untie-embeddings-and-output-weights", "--no-gradient-accumulation-fusion",
                               "--torch-fsdp2-no-reshard-after-forward"}),
                    2)
                  .distributed.keep_params_after_forward);
  // ZeRO-3 composes with pipelines, context parallelism and full recomputation.
  EXPECT_TRUE(fsdp({"--pipeline-model-parallel-size", "2"}, 4).shard_params());
  EXPECT_TRUE(fsdp({"--context-parallel-size", "2"}, 4).shard_params());
  EXPECT_TRUE(
      fsdp({"--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"})
          .shard_params());
  EXPECT_USER_ERROR(fsdp({"--check-weight-hash-across-dp-replicas-interval", "2"}),
                    "--check-weight-hash-across-dp-replicas-interval is not supported with optim_grads_params");
  // optim_grads composes with the weight-hash check (its weights are whole between uses).
  EXPECT_NO_THROW(fsdp({"--data-parallel-sharding-strategy", "optim_grads", "--check-weight-hash-across-dp-replicas-interval", "2"}));
  for (const char* strategy : {"optim_grads", "optim_grads_params"})
    EXPECT_USER_ERROR(fsdp({"--data-parallel-sharding-strategy", strategy, "--overlap-grad-reduce", "--overlap-param-gather",
                            "--overlap-param-gather-with-optimizer-step", "--num-layers", "4", "--pipeline-model-parallel-size",
                            "2", "--num-layers-per-virtual-pipeline-stage", "1", "--ckpt-format", "torch", "--global-batch-size", "8"},
                           4),
                      "--overlap-param-gather-with-optimizer-step with --data-parallel-sharding-strategy " +
                          std::string(strategy) + " is not supported");
  EXPECT_USER_ERROR(fsdp({"--megatron-fsdp-main-params-dtype", "bf16"}), "--megatron-fsdp-main-params-dtype bf16 is not supported yet");
  EXPECT_USER_ERROR(fsdp({"--bf16", "--megatron-fsdp-main-params-dtype", "auto"}),
                    "--megatron-fsdp-main-params-dtype auto is not supported yet");
  EXPECT_USER_ERROR(fsdp({"--bf16", "--megatron-fsdp-grad-comm-dtype", "bf16"}),
                    "--megatron-fsdp-grad-comm-dtype bf16 is not supported yet");
  EXPECT_USER_ERROR(fsdp({"--bf16", "--megatron-fsdp-main-grads-dtype", "bf16"}),
                    "--megatron-fsdp-main-grads-dtype bf16 differs from the gradient buffer's dtype (fp32)");
  EXPECT_USER_ERROR(fsdp({"--outer-dp-sharding-strategy", "optim"}), "--outer-dp-sharding-strategy optim is not supported yet");
  EXPECT_USER_ERROR(fsdp({"--data-parallel-sharding-strategy", "no_shard", "--overlap-grad-reduce", "--overlap-param-gather"}),
                    "no_shard has nothing to gather");
  EXPECT_USER_ERROR(build(tiny_args({"--use-torch-fsdp2", "--no-gradient-accumulation-fusion"}), 2),
                    "--use-torch-fsdp2 requires --untie-embeddings-and-output-weights");
  EXPECT_USER_ERROR(build(tiny_args({"--use-torch-fsdp2", "--untie-embeddings-and-output-weights"}), 2),
                    "--use-torch-fsdp2 is not supported with gradient accumulation fusion");
  EXPECT_USER_ERROR(build(tiny_args({"--use-torch-fsdp2", "--untie-embeddings-and-output-weights",
                                     "--no-gradient-accumulation-fusion", "--use-distributed-optimizer"}),
                          2),
                    "--use-torch-fsdp2 is not supported with MCore's distributed optimizer");
}

}  // namespace fp8tron
