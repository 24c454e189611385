// Reliability through the trainer (one process, CPU): a NaN stops the run and keeps the last good
// checkpoint (--rerun-mode disabled; the rerun engine: test_rerun.cpp), no checkpoint holds
// non-finite state, the LR schedule check on resume, vocabulary padding across layouts, token ids
// outside the vocabulary (also when the data loader's thread meets them first), one job per save
// directory, the hang report's side channel, and the one
// line a run that ends on an exception prints.
#include <gtest/gtest.h>

#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <cmath>
#include <condition_variable>
#include <chrono>
#include <filesystem>
#include <future>
#include <mutex>

#include "tests/checkpoint/temp_dir.h"
#include "data/indexed_dataset.h"
#include "data/loader/batch_loader.h"
#include "fp8/fp8_linear.h"
#include "models/gpt_model.h"
#include "parallel/progress_board.h"
#include "tests/test_helpers.h"
#include "checkpoint/checkpoint_dir.h"
#include "checkpoint/load.h"
#include "checkpoint/metadata.h"
#include "checkpoint/save.h"
#include "checkpoint/save_dir_lock.h"
#include "trainer/fatal_error.h"
#include "trainer/cli/checkpoint_args.h"
#include "trainer/logging/tensorboard_writer.h"
#include "optim/loss_scaler.h"
#include "optim/lr_schedule.h"
#include "optim/mixed_precision_optimizer.h"
#include "trainer/trainer.h"

namespace fp8tron {
namespace {
using namespace fp8tron::testing;
using checkpoint::testing::TempDir;

Config config_of(const std::vector<std::string>& extra) {
  return build(with(tiny_args({"--global-batch-size", "4", "--lr", "3e-3", "--log-interval", "1000", "--eval-iters", "0",
                               "--weight-decay", "0.1"}),
                    extra));
}

TrainResult run(const std::vector<std::string>& args, TrainOptions options = {.collect_final_weights = true}) {
  return train(config_of(args), options);
}

void expect_identical_weights(const TrainResult& a, const TrainResult& b) {
  ASSERT_EQ(a.final_weights.size(), b.final_weights.size());
  for (const auto& [name, w] : a.final_weights) EXPECT_TRUE(torch::equal(w, b.final_weights.at(name))) << name;
}

TEST(NanCheck, ANanLossStopsTheRunAndTheLastGoodCheckpointResumesExactly) {
  TempDir dir;
  // --rerun-mode disabled judges the first result (validate_results: tests/trainer/test_rerun.cpp).
  const std::vector<std::string> base = {"--train-iters", "10", "--save-interval", "2", "--rerun-mode", "disabled"};
  const TrainResult straight = run(base);
  EXPECT_USER_ERROR(run(with(base, {"--save", dir.path(), "--fp8tron-test-inject-nan", "5"})),
                    "iteration 5: the loss is NaN and the gradient norm NaN (the first parameter whose gradient is not "
                    "finite: embedding.word_embeddings.weight); stopping, as --check-for-nan-in-loss-and-grad asks");
  // Saved at 2 and 4; nothing at 5 or later.
  EXPECT_EQ(checkpoint::read_tracker(dir.path())->iteration, 4);
  EXPECT_EQ(checkpoint::list_checkpoint_iterations(dir.path()), (std::vector<int64_t>{2, 4}));
  const TrainResult resumed = run(with(base, {"--load", dir.path()}));
  EXPECT_EQ(std::vector<double>(straight.losses.begin() + 4, straight.losses.end()), resumed.losses);
  expect_identical_weights(straight, resumed);
}

TEST(NanCheck, TheFirstParameterWithANonFiniteGradientIsNamed) {
  EXPECT_USER_ERROR(run({"--train-iters", "6", "--rerun-mode", "disabled", "--fp8tron-test-inject-nan",
                         "3:decoder.layers.1.mlp.linear_fc2.weight"}),
                    "iteration 3: the gradient norm is NaN (the first parameter whose gradient is not finite: "
                    "decoder.layers.1.mlp.linear_fc2.weight)");
  // Async saves in flight are committed before the run stops (they hold the state before the NaN).
  TempDir dir;
  EXPECT_USER_ERROR(run({"--train-iters", "6", "--save", dir.path(), "--save-interval", "2", "--async-save",
                         "--rerun-mode", "disabled", "--fp8tron-test-inject-nan", "3:decoder.final_layernorm.weight"}),
                    "decoder.final_layernorm.weight");
  EXPECT_EQ(checkpoint::read_tracker(dir.path())->iteration, 2);
}

TEST(NanCheck, SwitchedOffTheNanIterationIsSkippedAndTrainingGoesOn) {
  const TrainResult r = run({"--train-iters", "6", "--no-check-for-nan-in-loss-and-grad", "--fp8tron-test-inject-nan", "3"});
  ASSERT_EQ(r.losses.size(), 6u);
  EXPECT_TRUE(std::isnan(r.losses[2]));
  EXPECT_TRUE(std::isfinite(r.losses[5]));
  for (const auto& [name, w] : r.final_weights) EXPECT_TRUE(torch::isfinite(w).all().item<bool>()) << name;
}

TEST(NanCheck, Fp16DynamicLossScalingTurnsItOffAsMegatronDoes) {
  const Config dynamic = config_of({"--fp16"});
  EXPECT_FALSE(dynamic.training.numerics.nan_in_loss_and_grad);
  EXPECT_NE(std::find(dynamic.hint_warnings.begin(), dynamic.hint_warnings.end(),
                      "Setting args.check_for_nan_in_loss_and_grad to False since dynamic loss scaling is being used"),
            dynamic.hint_warnings.end());
  EXPECT_TRUE(config_of({"--fp16", "--loss-scale", "1024"}).training.numerics.nan_in_loss_and_grad);
  EXPECT_TRUE(config_of({"--bf16"}).training.numerics.nan_in_loss_and_grad);
  EXPECT_TRUE(config_of({"--check-for-nan-in-loss-and-grad"}).training.numerics.nan_in_loss_and_grad);
  EXPECT_USER_ERROR(config_of({"--check-for-nan-in-loss-and-grad", "--no-check-for-nan-in-loss-and-grad"}), "contradict");
}

// A model and optimizer without the training loop, to save hand-made state.
class StateRig {
 public:
  explicit StateRig(Config c)
      : config_(std::move(c)), parallel_(single_process_state()), model_(config_.model), schedule_(config_.lr_schedule),
        scaler_(config_.precision) {
    std::vector<NamedParam> params;
    const auto infos = model_->param_infos();
    for (const auto& item : model_->named_parameters()) params.push_back({item.key(), item.value(), infos.at(item.key())});
    optimizer_ = std::make_unique<MixedPrecisionOptimizer>(params, config_.optimizer, config_.precision, parallel_, false,
                                                           config_.model.moe.enabled());
  }
  TrainingState state() {
    return {config_, parallel_, torch::Device(torch::kCPU), *optimizer_, schedule_, scaler_, samples_, samples_};
  }
  MixedPrecisionOptimizer& optimizer() { return *optimizer_; }
  OptimizerDomain& dense() { return *optimizer_->domains().front(); }
  OptimizerDomain& experts() { return *optimizer_->domains().at(1); }

 private:
  Config config_;
  ParallelState parallel_;
  GptModel model_;
  std::unique_ptr<MixedPrecisionOptimizer> optimizer_;
  LrSchedule schedule_;
  LossScaler scaler_;
  int64_t samples_ = 0;
};

TEST(NanCheck, NoCheckpointWithNonFiniteStateIsEverCommitted) {
  TempDir dir;
  StateRig rig(config_of({"--bf16", "--save", dir.path()}));
  save_checkpoint(rig.state(), 1);
  torch::NoGradGuard no_grad;
  const auto& slot = rig.dense().param_slots()[3];
  rig.dense().exp_avg_sq().narrow(0, slot.offset + 1, 1).fill_(std::numeric_limits<float>::infinity());
  EXPECT_USER_ERROR(save_checkpoint(rig.state(), 2),
                    "refusing to save the checkpoint of iteration 2: 'optimizer.state.exp_avg_sq." + slot.name +
                        "' holds NaN or inf");
  rig.dense().exp_avg_sq().zero_();
  rig.dense().main_params().narrow(0, 0, 1).fill_(std::nan(""));
  EXPECT_USER_ERROR(save_checkpoint(rig.state(), 3), "holds NaN or inf (the run has diverged)");
  EXPECT_EQ(checkpoint::read_tracker(dir.path())->iteration, 1);
  EXPECT_EQ(checkpoint::list_checkpoint_iterations(dir.path()), (std::vector<int64_t>{1}));
  // The version that wrote it is recorded.
  EXPECT_NE(checkpoint::read_metadata(dir / "iter_0000001").fp8tron_commit, "");
}

// Mixture of experts: the routed experts' gradients and optimizer state live in their own
// optimizer domain (expert data-parallel); the NaN check and the save's check cover it as well.
std::vector<std::string> moe_args() {
  return {"--num-experts", "4", "--moe-ffn-hidden-size", "32", "--moe-layer-freq", "([0]+[1])", "--moe-router-topk", "2"};
}

TEST(NanCheck, AnExpertsNonFiniteGradientStopsTheRunAndIsNamed) {
  TempDir dir;
  EXPECT_USER_ERROR(run(with(moe_args(), {"--train-iters", "6", "--save", dir.path(), "--save-interval", "2",
                                          "--rerun-mode", "disabled", "--fp8tron-test-inject-nan",
                                          "3:decoder.layers.1.mlp.experts.linear_fc1.weight2"})),
                    "iteration 3: the gradient norm is NaN (the first parameter whose gradient is not finite: "
                    "decoder.layers.1.mlp.experts.linear_fc1.weight2)");
  EXPECT_EQ(checkpoint::read_tracker(dir.path())->iteration, 2);
  // With the distributed optimizer (the experts' shard of the state) the same.
  EXPECT_USER_ERROR(run(with(moe_args(), {"--train-iters", "6", "--use-distributed-optimizer", "--rerun-mode", "disabled",
                                          "--fp8tron-test-inject-nan", "4:decoder.layers.1.mlp.experts.linear_fc2.weight0"})),
                    "iteration 4: the gradient norm is NaN (the first parameter whose gradient is not finite: "
                    "decoder.layers.1.mlp.experts.linear_fc2.weight0)");
  // A dense parameter earlier in the model than the expert is named first.
  EXPECT_USER_ERROR(run(with(moe_args(), {"--train-iters", "6", "--rerun-mode", "disabled", "--fp8tron-test-inject-nan", "3"})),
                    "(the first parameter whose gradient is not finite: embedding.word_embeddings.weight)");
}

TEST(NanCheck, NoCheckpointWithNonFiniteExpertStateIsCommitted) {
  TempDir dir;
  StateRig rig(config_of(with(moe_args(), {"--bf16", "--save", dir.path()})));
  ASSERT_EQ(rig.optimizer().domains().size(), 2u);
  save_checkpoint(rig.state(), 1);
  torch::NoGradGuard no_grad;
  const auto& slot = rig.experts().param_slots().back();
  ASSERT_NE(slot.name.find(".experts."), std::string::npos) << slot.name;
  rig.experts().exp_avg().narrow(0, slot.offset + slot.numel - 1, 1).fill_(std::nan(""));
  EXPECT_USER_ERROR(save_checkpoint(rig.state(), 2), "refusing to save the checkpoint of iteration 2: 'optimizer.state.exp_avg." +
                                                         slot.name + "' holds NaN or inf");
  rig.experts().exp_avg().zero_();
  rig.experts().main_params().narrow(0, slot.offset, 1).fill_(std::numeric_limits<float>::infinity());
  EXPECT_USER_ERROR(save_checkpoint(rig.state(), 3), "'optimizer.state.fp32_param." + slot.name + "' holds NaN or inf");
  EXPECT_EQ(checkpoint::list_checkpoint_iterations(dir.path()), (std::vector<int64_t>{1}));
}

TEST(ScheduleOnResume, AChangedScheduleIsRefusedUnlessOverriddenOrTakenFromTheCheckpoint) {
  TempDir dir;
  const std::vector<std::string> schedule = {"--train-iters", "12", "--lr-decay-style", "cosine", "--lr-warmup-iters", "2",
                                             "--min-lr", "1e-4"};
  const TrainResult straight = run(schedule);
  run(with(schedule, {"--exit-interval", "6", "--save", dir.path()}));
  // Extending the run changes the decay span and Megatron's weight-decay span (both from
  // --train-iters), and another peak LR: each difference is named with its flags.
  const auto changed = with({"--load", dir.path(), "--lr", "1e-3"}, {"--train-iters", "16", "--lr-decay-style", "cosine",
                                                                      "--lr-warmup-iters", "2", "--min-lr", "1e-4"});
  EXPECT_USER_ERROR(run(changed), "learning rate is 0.003 in the checkpoint but 0.001 here (--lr)");
  EXPECT_USER_ERROR(run(changed), "total number of iterations is 48 in the checkpoint but 64 here");
  EXPECT_USER_ERROR(run(changed), "total number of weight decay iterations is 48 in the checkpoint but 64 here");
  EXPECT_USER_ERROR(run(changed), "pass --override-opt-param-scheduler to use this run's values, or "
                                  "--use-checkpoint-opt_param-scheduler to continue with the checkpoint's");
  // The checkpoint's schedule continues exactly as the uninterrupted run.
  const TrainResult taken = run(with(changed, {"--use-checkpoint-opt_param-scheduler", "--train-iters", "12"}));
  EXPECT_EQ(std::vector<double>(straight.losses.begin() + 6, straight.losses.end()), taken.losses);
  expect_identical_weights(straight, taken);
  // This run's schedule, as asked: another learning rate from iteration 7 on.
  const TrainResult overridden = run(with(changed, {"--override-opt-param-scheduler"}));
  ASSERT_EQ(overridden.losses.size(), 10u);
  EXPECT_EQ(overridden.losses[0], straight.losses[6]) << "the weights are the checkpoint's";
  EXPECT_NE(overridden.losses[1], straight.losses[7]) << "the update used this run's learning rate";
  EXPECT_USER_ERROR(config_of({"--override-opt-param-scheduler", "--use-checkpoint-opt-param-scheduler"}),
                    "both override and use-checkpoint are set");
  // Weights-only loads do not take the schedule.
  EXPECT_EQ(run(with(changed, {"--no-load-optim"})).losses.size(), 10u);
}

TEST(VocabPadding, ACheckpointPaddedDifferentlyLoadsWithTheRowsPastTheVocabularyTrimmedOrPadded) {
  // --vocab-size 600 (601 ids with the end-of-document one) padded to 768 (a multiple of 256, as
  // --make-vocab-size-divisible-by 128 with TP 2 pads) and to 640 (128 x TP 1).
  TempDir wide, narrow;
  const std::vector<std::string> model = {"--vocab-size", "600", "--train-iters", "3"};
  const TrainResult saved_wide = run(with(model, {"--make-vocab-size-divisible-by", "256", "--save", wide.path()}));
  const TrainResult saved_narrow = run(with(model, {"--save", narrow.path()}));
  const auto vocab_rows = torch::indexing::Slice(0, 601);
  // 768 -> 640: the first 640 rows are the checkpoint's.
  const TrainResult trimmed = run(with(model, {"--load", wide.path(), "--no-load-optim", "--train-iters", "4"}),
                                  {.collect_initial_weights = true});
  const torch::Tensor w768 = saved_wide.final_weights.at("embedding.word_embeddings.weight");
  const torch::Tensor t640 = trimmed.initial_weights.at("embedding.word_embeddings.weight");
  ASSERT_EQ(t640.size(0), 640);
  EXPECT_TRUE(torch::equal(t640, w768.narrow(0, 0, 640)));
  // 640 -> 768, with the optimizer state: rows past 640 repeat row 639 (Megatron's converter).
  const TrainResult padded = run(with(model, {"--load", narrow.path(), "--make-vocab-size-divisible-by", "256",
                                              "--train-iters", "4", "--override-opt-param-scheduler"}),
                                 {.collect_initial_weights = true});
  const torch::Tensor w640 = saved_narrow.final_weights.at("embedding.word_embeddings.weight");
  const torch::Tensor p768 = padded.initial_weights.at("embedding.word_embeddings.weight");
  ASSERT_EQ(p768.size(0), 768);
  EXPECT_TRUE(torch::equal(p768.index({vocab_rows}), w640.index({vocab_rows})));
  EXPECT_TRUE(torch::equal(p768.narrow(0, 640, 128), w640.narrow(0, 639, 1).expand({128, w640.size(1)})));
  ASSERT_EQ(padded.losses.size(), 1u);
  EXPECT_TRUE(std::isfinite(padded.losses[0]));
  // A different vocabulary is a different model, still refused.
  EXPECT_USER_ERROR(run({"--vocab-size", "500", "--train-iters", "4", "--load", narrow.path()}),
                    "vocab_size is 601 in the checkpoint but 501 here");
}

TEST(VocabPadding, UseCheckpointArgsCarriesThePaddedVocabulary) {
  TempDir dir;
  run({"--vocab-size", "600", "--train-iters", "2", "--make-vocab-size-divisible-by", "256", "--save", dir.path()});
  FlagValues flags = parse(with(tiny_args({"--use-checkpoint-args", "--load", dir.path()}), {"--vocab-size", "600"}));
  apply_checkpoint_args(flags);
  EXPECT_EQ(build_config(flags, LaunchEnv{}, false).model.padded_vocab_size, 768);
  // Given on the command line, --padded-vocab-size wins; it must split over tensor parallelism.
  EXPECT_EQ(config_of({"--padded-vocab-size", "1000"}).model.padded_vocab_size, 1000);
  EXPECT_USER_ERROR(config_of({"--padded-vocab-size", "32"}), "is smaller than the tokenizer's vocabulary (65)");
  EXPECT_USER_ERROR(build(with(tiny_args({"--padded-vocab-size", "1001", "--tensor-model-parallel-size", "2"}), {}), 2),
                    "--padded-vocab-size (1001) is not divisible by --tensor-model-parallel-size (2)");
}

TEST(TokenIds, AnIdOutsideTheVocabularyNamesTheDatasetDocumentAndId) {
  TempDir dir;
  const std::string prefix = dir / "corpus_text_document";
  {
    data::IndexedDatasetBuilder builder(data::bin_path(prefix), data::DType::UInt16);
    for (int doc = 0; doc < 40; ++doc) {
      std::vector<int64_t> tokens(50);
      for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = int64_t((doc * 31 + i * 7) % 60);
      if (doc == 13) tokens[20] = 700;  // tokenized with another tokenizer
      tokens.back() = 63;               // end of document (NullTokenizer: --vocab-size - 1)
      builder.add_document(tokens.data(), int64_t(tokens.size()), {int32_t(tokens.size())});
    }
    builder.finalize(data::idx_path(prefix));
  }
  std::vector<std::string> args = tiny_args({"--global-batch-size", "4", "--eval-iters", "0", "--train-iters", "40",
                                              "--data-path", prefix, "--tokenizer-type", "NullTokenizer", "--split",
                                              "100,0,0", "--data-cache-path", dir / "cache"});
  args.erase(std::find(args.begin(), args.end(), "--builtin-data"));
  EXPECT_USER_ERROR(train(build(args)), "token id 700 in train sample ");
  EXPECT_USER_ERROR(train(build(args)),
                    "dataset " + prefix + ", document 13, token 20 of it) is outside the vocabulary of 64 tokens");
}

// Samples from `bad` on fail slowly, so that the trainer is already waiting for the batch the
// loader's thread is preparing when the thread fails.
class SlowlyFailingSource : public SampleSource {
 public:
  SlowlyFailingSource(int64_t seq_length, int64_t bad) : seq_length_(seq_length), bad_(bad) {}
  void sample(Split, int64_t index, int64_t* out) const override {
    if (index >= bad_) {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      throw UserError("sample " + std::to_string(index) + " is unreadable");
    }
    for (int64_t i = 0; i <= seq_length_; ++i) out[i] = (index + i) % 10;
  }

 private:
  int64_t seq_length_, bad_;
};

TEST(TokenIds, ABatchTheLoadersThreadFailsOnIsReportedNotWaitedForForever) {
  BatchOptions o;
  o.seq_length = 8;
  o.micro_batch_size = 2;
  o.stride = 2;
  o.prefetch = 2;
  auto loader = std::make_shared<BatchLoader>(std::make_shared<SlowlyFailingSource>(8, 4), Split::Train, o,
                                              torch::kCPU);
  loader->load(0);
  loader->load(2);
  // The thread is now preparing the batch at 4 and fails on it 300 ms later, while load(4) waits.
  auto failed = std::async(std::launch::async, [loader] {
    try {
      loader->load(4);
    } catch (const UserError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  });
  if (failed.wait_for(std::chrono::seconds(30)) != std::future_status::ready) {
    ADD_FAILURE() << "load(4) still waits 30 s after the loader's thread failed on that batch";
    std::_Exit(1);  // the waiting thread cannot be joined
  }
  EXPECT_EQ(failed.get(), "sample 4 is unreadable");
}

TEST(SaveDirLock, ASecondJobOnTheSameSaveIsRefusedWithOneLine) {
  TempDir dir;
  auto other = checkpoint::SaveDirLock::acquire(dir.path());
  EXPECT_USER_ERROR(run({"--train-iters", "2", "--save", dir.path()}), "is in use by another fp8tron job (host=");
  EXPECT_FALSE(checkpoint::read_tracker(dir.path())) << "the refused job saved nothing";
  other.reset();
  run({"--train-iters", "2", "--save", dir.path()});
  EXPECT_EQ(checkpoint::read_tracker(dir.path())->iteration, 2);
}

TEST(Fp8Stats, EachFp8LinearsAmaxUnderflowsAndOverflowsGoToTensorBoard) {
  TempDir dir;
  run({"--train-iters", "4", "--fp8-format", "hybrid", "--fp8-recipe", "delayed", "--tensorboard-dir", dir.path(),
       "--tensorboard-log-interval", "2", "--log-fp8-stats-to-tensorboard"});
  std::string file;
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) file = e.path().string();
  std::map<std::string, std::vector<double>> by_tag;
  for (const auto& e : read_tensorboard_scalars(file))
    if (e.tag.rfind("fp8/", 0) == 0) by_tag[e.tag].push_back(e.value);
  const std::string qkv = "fp8/decoder.layers.0.self_attention.linear_qkv/";
  for (const char* role : {"input", "weight", "grad_output"}) {
    ASSERT_EQ(by_tag[qkv + role + "/amax"].size(), 2u) << role << ": at iterations 2 and 4";
    EXPECT_GT(by_tag[qkv + role + "/amax"][0], 0.0) << role;
    EXPECT_GT(by_tag[qkv + role + "/elements"][0], 0.0) << role;
  }
  // Every layer's four linears are there.
  int layers = 0;
  for (const auto& [tag, v] : by_tag) layers += tag.find("/weight/amax") != std::string::npos;
  EXPECT_EQ(layers, 8);
}

// The routed experts' grouped casts (one pass over every expert's tokens) are recorded per expert,
// as a per-tensor cast is.
TEST(Fp8Stats, EachExpertsGroupedCastsGoToTensorBoard) {
  TempDir dir;
  run(with(moe_args(), {"--train-iters", "2", "--fp8-format", "hybrid", "--fp8-recipe", "delayed", "--tensorboard-dir",
                        dir.path(), "--tensorboard-log-interval", "2", "--log-fp8-stats-to-tensorboard"}));
  std::string file;
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) file = e.path().string();
  std::map<std::string, double> elements;  // per expert site and role
  for (const auto& e : read_tensorboard_scalars(file))
    if (e.tag.rfind("fp8/", 0) == 0 && e.tag.find(".experts.") != std::string::npos &&
        e.tag.size() > 9 && e.tag.compare(e.tag.size() - 9, 9, "/elements") == 0)
      elements[e.tag] += e.value;
  for (const char* role : {"/input/", "/weight/", "/grad_output/"}) {
    int sites = 0;
    double total = 0;
    for (const auto& [tag, n] : elements)
      if (tag.find(role) != std::string::npos) ++sites, total += n;
    EXPECT_GT(sites, 0) << role << " of the experts' linears";
    EXPECT_GT(total, 0.0) << role;
  }
}

TEST(Fp8Stats, UnderflowsAndOverflowsAreCountedPerCast) {
  // Delayed scaling's first step casts at scale 1: 1e-6 rounds to zero in E4M3 (smallest
  // subnormal 2^-9) and 1000 saturates at 448; zeros are not underflows.
  fp8::Fp8EngineOptions o;
  o.recipe = fp8::make_recipe(fp8::RecipeKind::kDelayed, fp8::Fp8Format::kHybrid);
  o.num_layers = 2;
  fp8::Fp8Engine engine(o, torch::Device(torch::kCPU));
  auto site = engine.add_site("decoder.layers.0.mlp.linear_fc1", 0, 16, 16);
  ASSERT_TRUE(site);
  auto x = torch::ones({16, 16});
  x.index_put_({0, torch::indexing::Slice(0, 3)}, 1e-6);  // 3 underflows
  x.index_put_({1, torch::indexing::Slice(0, 5)}, 1000.0);  // 5 overflows
  x.index_put_({2, torch::indexing::Slice(0, 2)}, 0.0);  // zeros
  auto w = torch::full({16, 16}, 0.01).requires_grad_(true);
  engine.collect_stats(true);
  fp8::fp8_linear(x, w, {}, *site);
  engine.collect_stats(false);
  fp8::fp8_linear(x, w, {}, *site);  // not collected
  std::map<std::string, fp8::Fp8Engine::CastStats> by_role;
  for (const auto& s : engine.take_stats()) by_role[fp8::tensor_role_name(s.role)] = s;
  ASSERT_TRUE(by_role.count("input"));
  EXPECT_EQ(by_role["input"].site, "decoder.layers.0.mlp.linear_fc1");
  EXPECT_EQ(by_role["input"].amax, 1000.0);
  EXPECT_EQ(by_role["input"].underflows, 3.0);
  EXPECT_EQ(by_role["input"].overflows, 5.0);
  EXPECT_EQ(by_role["input"].elements, 256.0);
  EXPECT_EQ(by_role["weight"].underflows, 0.0);
  EXPECT_TRUE(engine.take_stats().empty()) << "taken once";
}

TEST(InertFlags, FlagsThatDoNothingHereAreWarnedAbout) {
  auto warnings_of = [](const std::vector<std::string>& extra) { return config_of(extra).hint_warnings; };
  auto has = [](const std::vector<std::string>& warnings, const std::string& text) {
    for (const auto& w : warnings)
      if (w.find(text) != std::string::npos) return true;
    return false;
  };
  // Megatron's own text.
  EXPECT_TRUE(has(warnings_of({"--sequence-parallel"}), "Disabling sequence parallelism because tensor model parallelism is disabled"));
  EXPECT_FALSE(config_of({"--sequence-parallel"}).distributed.sequence_parallel);
  EXPECT_TRUE(has(warnings_of({"--fp8-recipe", "tensorwise", "--fp8-margin", "1"}),
                  "--fp8-recipe, --fp8-margin have no effect without --fp8-format"));
  EXPECT_TRUE(has(warnings_of({"--fp8-format", "hybrid", "--fp8-recipe", "tensorwise", "--fp8-margin", "1"}),
                  "--fp8-margin: delayed-scaling settings, ignored with --fp8-recipe tensorwise"));
  EXPECT_TRUE(has(warnings_of({"--hysteresis", "4"}), "--hysteresis: loss scaling applies to --fp16 only"));
  EXPECT_TRUE(has(warnings_of({"--use-distributed-optimizer"}), "nothing to shard or overlap with data-parallel size 1"));
  EXPECT_TRUE(has(warnings_of({"--save-interval", "5"}), "--save-interval has no effect without --save"));
  EXPECT_TRUE(has(warnings_of({"--ckpt-step", "5", "--no-load-optim"}), "--ckpt-step, --no-load-optim have no effect without --load"));
  EXPECT_TRUE(has(warnings_of({"--sgd-momentum", "0.8"}), "--sgd-momentum: not used by --optimizer adam"));
  EXPECT_TRUE(has(warnings_of({"--rotary-base", "500000"}), "rotary settings, ignored without --position-embedding-type rope"));
  EXPECT_TRUE(has(warnings_of({"--log-fp8-stats-to-tensorboard"}), "--log-fp8-stats-to-tensorboard has no effect without --fp8-format"));
  EXPECT_TRUE(has(warnings_of({"--wgrad-deferral-limit", "2"}), "--wgrad-deferral-limit has no effect without --defer-embedding-wgrad-compute"));
  EXPECT_TRUE(config_of({}).hint_warnings.empty()) << "the tiny configuration has no inert flags";
  // Checksum verification: on by default.
  EXPECT_TRUE(config_of({}).checkpoint.verify_checksums);
  EXPECT_FALSE(config_of({"--no-verify-integrity"}).checkpoint.verify_checksums);
  EXPECT_USER_ERROR(config_of({"--verify-integrity", "--no-verify-integrity"}), "contradict");
}

TEST(ProgressBoard, AHangReportNamesWhoDidNotArriveAndEveryRanksIteration) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::shared_ptr<c10d::Store> shared(store.get(), [keep = store](c10d::Store*) {});
  ProgressBoard::Options options;
  options.publish_every = std::chrono::milliseconds(50);
  ProgressBoard rank0(shared, 0, 3, options), rank1(shared, 1, 3, options), rank2(shared, 2, 3, options);
  const std::vector<int> dp = {0, 1, 2};
  const std::string key = ProgressBoard::group_key("dp", dp);
  EXPECT_EQ(key, "dp[0,1,2]");
  // Iteration 7 done everywhere but on rank 2; ranks 0 and 1 enter all_reduce #2, rank 2 does not.
  for (auto* b : {&rank0, &rank1}) {
    b->iteration_finished(7);
    b->entered(key);
  }
  rank2.iteration_finished(6);
  rank2.entered(key);
  rank0.waiting(key, "all_reduce", rank0.entered(key));
  rank1.waiting(key, "all_reduce", rank1.entered(key));
  for (auto* b : {&rank0, &rank1, &rank2}) b->publish();
  const auto r0 = rank0.describe("dp", dp, "all_reduce", 2, std::chrono::seconds(90));
  const auto r1 = rank1.describe("dp", dp, "all_reduce", 2, std::chrono::seconds(90));
  EXPECT_TRUE(r0.print);
  EXPECT_FALSE(r1.print) << "only the lowest waiting rank prints";
  EXPECT_NE(r0.text.find("collective hang: all_reduce #2 on group 'dp' (global ranks 0,1,2) has waited 90 s on rank 0"),
            std::string::npos)
      << r0.text;
  EXPECT_NE(r0.text.find("not arrived: rank 2 (last finished iteration 6; it entered 1 collectives on this group; not in "
                         "a collective)"),
            std::string::npos)
      << r0.text;
  EXPECT_NE(r0.text.find("Last finished iteration per rank: 0:7 1:7 2:6"), std::string::npos) << r0.text;
  EXPECT_EQ(r0.text.find("rank 1 ("), std::string::npos) << "rank 1 has arrived";
}

TEST(ProgressBoard, ARankWaitingInAnotherCollectiveIsReportedInTheHeadsWords) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::shared_ptr<c10d::Store> shared(store.get(), [keep = store](c10d::Store*) {});
  ProgressBoard::Options options;
  options.publish_every = std::chrono::milliseconds(50);
  ProgressBoard rank0(shared, 0, 2, options), rank1(shared, 1, 2, options);
  const std::vector<int> dp = {0, 1};
  const std::string key = ProgressBoard::group_key("dp", dp);
  rank0.iteration_finished(3);
  rank1.iteration_finished(3);
  rank0.waiting(key, "all_reduce", rank0.entered(key));
  const std::string pp = ProgressBoard::group_key("pp", {1});
  rank1.waiting(pp, "recv", rank1.entered(pp));  // rank 1 waits elsewhere instead
  for (auto* b : {&rank0, &rank1}) b->publish();
  const auto r = rank0.describe("dp", dp, "all_reduce", 1, std::chrono::seconds(20));
  EXPECT_NE(r.text.find("has waited 20 s on rank 0"), std::string::npos) << r.text;
  EXPECT_NE(r.text.find("it entered 0 collectives on this group; has waited "), std::string::npos) << r.text;
  EXPECT_NE(r.text.find(" s in recv #1 on group pp[1])"), std::string::npos) << r.text;
  EXPECT_EQ(r.text.find("waiting in"), std::string::npos) << r.text;
}

// A store whose host stops answering (a stopped rank 0 under mpirun): every call blocks until the
// store is thawed.
class FreezableStore : public c10d::HashStore {
 public:
  void freeze() {
    std::lock_guard<std::mutex> lock(mutex_);
    frozen_ = true;
  }
  void thaw() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      frozen_ = false;
    }
    thawed_.notify_all();
  }
  void set(const std::string& key, const std::vector<uint8_t>& value) override {
    block();
    HashStore::set(key, value);
  }
  std::vector<uint8_t> get(const std::string& key) override {
    block();
    return HashStore::get(key);
  }
  bool check(const std::vector<std::string>& keys) override {
    block();
    return HashStore::check(keys);
  }

 private:
  void block() {
    std::unique_lock<std::mutex> lock(mutex_);
    thawed_.wait(lock, [this] { return !frozen_; });
  }
  std::mutex mutex_;
  std::condition_variable thawed_;
  bool frozen_ = false;
};

TEST(ProgressBoard, TheBackgroundThreadPublishesTheLatestRecord) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::shared_ptr<c10d::Store> shared(store.get(), [keep = store](c10d::Store*) {});
  ProgressBoard::Options options;
  options.publish_every = std::chrono::milliseconds(50);
  ProgressBoard board(shared, 0, 1, options);
  for (int i = 0; i < 3; ++i) board.entered("dp[0,1]");
  board.iteration_finished(5);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  std::string record;
  while (std::chrono::steady_clock::now() < deadline) {
    const auto bytes = store->get("fp8tron/progress/0");
    record.assign(bytes.begin(), bytes.end());
    if (record.find("iteration 5") != std::string::npos && record.find("group 3 dp[0,1]") != std::string::npos) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_NE(record.find("iteration 5"), std::string::npos) << record;
  EXPECT_NE(record.find("group 3 dp[0,1]"), std::string::npos) << record;
}

TEST(ProgressBoard, AReportAndTheExitDoNotWaitOnAStoreThatStoppedAnswering) {
  auto store = c10::make_intrusive<FreezableStore>();
  std::shared_ptr<c10d::Store> shared(store.get(), [keep = store](c10d::Store*) {});
  ProgressBoard::Options options;
  options.publish_every = std::chrono::milliseconds(50);
  options.read_limit = std::chrono::milliseconds(500);
  using Clock = std::chrono::steady_clock;
  {
    ProgressBoard rank1(shared, 1, 2, options);
    rank1.entered("dp[0,1]");
    store->freeze();
    const auto start = Clock::now();
    const auto r = rank1.describe("dp", {0, 1}, "all_reduce", 1, std::chrono::seconds(20));
    EXPECT_LT(Clock::now() - start, std::chrono::seconds(5));
    EXPECT_TRUE(r.print) << "every waiting rank prints when nobody can read the records";
    EXPECT_NE(r.text.find("collective hang: all_reduce #1 on group 'dp' (global ranks 0,1) has waited 20 s on rank 1; the "
                          "side channel did not answer within 0.5 s"),
              std::string::npos)
        << r.text;
    EXPECT_NE(r.text.find("rank 0 is stopped or dead"), std::string::npos) << r.text;
    // The board's thread is stuck in the store: destroying the board leaves it behind.
    const auto destroyed = Clock::now();
    {
      ProgressBoard another(shared, 0, 2, options);  // its first publish gives up after read_limit
    }
    EXPECT_LT(Clock::now() - destroyed, std::chrono::seconds(6));
  }
  store->thaw();
}

}  // namespace
}  // namespace fp8tron

namespace fp8tron {
namespace {

TEST(FatalError, RunningOutOfGpuMemoryIsAnErrorThatNamesTheRankAndTheFixes) {
  const c10::OutOfMemoryError oom(c10::SourceLocation{__func__, __FILE__, __LINE__},
                                  "CUDA out of memory. Tried to allocate 2.00 GiB.\nGPU 0 has a total capacity of 79.19 GiB");
  const FatalReport r = report_fatal_error(oom, 3);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.line.rfind("fp8tron: error: out of GPU memory on rank 3 (CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0", 0), 0u)
      << r.line;
  EXPECT_NE(r.line.find("--micro-batch-size"), std::string::npos);
  EXPECT_NE(r.line.find("--recompute-granularity full"), std::string::npos);
  EXPECT_EQ(r.line.find('\n'), std::string::npos);
  EXPECT_EQ(r.line.find("frame #"), std::string::npos) << r.line;
}

TEST(FatalError, AHostAllocationThatFailsIsAnOutOfHostMemoryError) {
  try {
    auto t = torch::empty({int64_t(1) << 52}, torch::kUInt8);  // 4 PiB: no machine has it
    FAIL() << "allocated " << t.numel() << " bytes";
  } catch (const std::exception& e) {
    const FatalReport r = report_fatal_error(e, -1);
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_EQ(r.line.rfind("fp8tron: error: out of host memory (", 0), 0u) << r.line;
    EXPECT_NE(r.line.find("--use-distributed-optimizer"), std::string::npos);
  }
  const FatalReport bad_alloc = report_fatal_error(std::bad_alloc(), 0);
  EXPECT_EQ(bad_alloc.line.rfind("fp8tron: error: out of host memory on rank 0 (", 0), 0u) << bad_alloc.line;
}

TEST(FatalError, ALibTorchErrorIsOneLineWithoutItsBacktrace) {
  try {
    torch::ones({2, 3}).matmul(torch::ones({4, 5}));
    FAIL() << "a shape mismatch was accepted";
  } catch (const std::exception& e) {
    ASSERT_NE(std::string(e.what()).find('\n'), std::string::npos);  // LibTorch's own text runs over lines
    const FatalReport r = report_fatal_error(e, -1);
    EXPECT_EQ(r.exit_code, 2);
    EXPECT_EQ(r.line.rfind("fp8tron: internal error: ", 0), 0u) << r.line;
    EXPECT_NE(r.line.find("cannot be multiplied"), std::string::npos) << r.line;
    EXPECT_EQ(r.line.find('\n'), std::string::npos) << r.line;
    EXPECT_NE(r.line.find("FP8TRON_BACKTRACE=1"), std::string::npos);
  }
}

TEST(FatalError, AUserErrorKeepsItsLineAndExitCode) {
  const FatalReport r = report_fatal_error(UserError("--lr must be positive"), 1);
  EXPECT_EQ(r.line, "fp8tron: error: --lr must be positive");
  EXPECT_EQ(r.exit_code, 1);
}

}  // namespace
}  // namespace fp8tron
