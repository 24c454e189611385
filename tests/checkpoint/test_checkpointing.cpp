// Checkpoint save and resume through the trainer (one process, CPU): exact resume, the flags
// around it, and the errors users see. Multi-process layouts and resharding: checkpoint_resume.cpp.
#include <gtest/gtest.h>

#include <signal.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <thread>

#include "tests/checkpoint/temp_dir.h"
#include "tests/test_helpers.h"
#include "checkpoint/checkpoint_dir.h"
#include "checkpoint/metadata.h"
#include "checkpoint/sharded_io.h"
#include "trainer/cli/checkpoint_args.h"
#include "checkpoint/async_saver.h"
#include "checkpoint/load.h"
#include "checkpoint/save.h"
#include "optim/loss_scaler.h"
#include "optim/lr_schedule.h"
#include "optim/mixed_precision_optimizer.h"
#include "models/gpt_model.h"
#include "trainer/trainer.h"

namespace fp8tron {
namespace {
using namespace fp8tron::testing;
using checkpoint::testing::TempDir;

Config checkpoint_config(const std::vector<std::string>& extra) {
  auto args = tiny_args({"--global-batch-size", "4", "--lr", "3e-3", "--log-interval", "1000", "--eval-interval", "5",
                         "--eval-iters", "1", "--weight-decay", "0.1"});
  args.insert(args.end(), extra.begin(), extra.end());
  return build(args);
}

TrainResult run(const std::vector<std::string>& args) {
  return train(checkpoint_config(args), TrainOptions{.collect_final_weights = true});
}

void expect_identical_weights(const TrainResult& a, const TrainResult& b) {
  ASSERT_EQ(a.final_weights.size(), b.final_weights.size());
  for (const auto& [name, w] : a.final_weights) {
    ASSERT_TRUE(b.final_weights.count(name)) << name;
    EXPECT_TRUE(torch::equal(w, b.final_weights.at(name))) << name << " differs";
  }
}

// 20 iterations straight vs 10, save (on --exit-interval), load into a fresh trainer, 10 more:
// identical losses and bitwise-identical weights.
void check_exact_resume(const std::vector<std::string>& model, const std::vector<std::string>& saving = {}) {
  TempDir dir;
  const auto base = with(model, {"--train-iters", "20"});
  TrainResult straight = run(base);
  ASSERT_EQ(straight.losses.size(), 20u);
  TrainResult first = run(with(with(base, {"--exit-interval", "10", "--save", dir.path()}), saving));
  EXPECT_EQ(first.iterations, 10);
  ASSERT_TRUE(checkpoint::read_tracker(dir.path()));
  EXPECT_EQ(checkpoint::read_tracker(dir.path())->iteration, 10);
  TrainResult resumed = run(with(base, {"--load", dir.path()}));
  EXPECT_EQ(resumed.iterations, 20);
  EXPECT_EQ(resumed.consumed_samples, straight.consumed_samples);
  EXPECT_EQ(std::vector<double>(straight.losses.begin() + 10, straight.losses.end()), resumed.losses);
  EXPECT_EQ(straight.last_validation_loss, resumed.last_validation_loss);
  expect_identical_weights(straight, resumed);
}

TEST(Checkpointing, ExactResumeFp32WithDropout) {
  check_exact_resume({"--attention-dropout", "0.1", "--hidden-dropout", "0.1"});
}

TEST(Checkpointing, ExactResumeBf16LlamaStyle) {
  check_exact_resume({"--bf16", "--swiglu", "--normalization", "RMSNorm", "--position-embedding-type", "rope",
                      "--disable-bias-linear", "--untie-embeddings-and-output-weights", "--group-query-attention",
                      "--num-query-groups", "2", "--attention-dropout", "0", "--hidden-dropout", "0.1"});
}

TEST(Checkpointing, ExactResumeFp16KeepsTheLossScaler) {
  check_exact_resume({"--fp16", "--initial-loss-scale", "65536", "--loss-scale-window", "4"});
}

TEST(Checkpointing, ExactResumeFp8DelayedScaling) {
  // A history longer than the interval and the max rule: the resumed scales depend on the saved
  // histories and step count, so a resume that dropped them would diverge.
  check_exact_resume({"--fp8-format", "hybrid", "--fp8-amax-history-len", "4", "--fp8-amax-compute-algo", "max",
                      "--fp8-interval", "3"});
}

// The precision-aware optimizer's bf16 Adam moments and bf16 main gradients: saved as bf16, resumed
// bitwise.
const std::vector<std::string> kBf16OptimizerStates = {"--bf16", "--use-distributed-optimizer",
                                                       "--use-precision-aware-optimizer", "--exp-avg-dtype", "bf16",
                                                       "--exp-avg-sq-dtype", "bf16"};
// FP8 attention's delayed gradient scales come from the previous step's amaxes: the checkpoint
// carries them (the core attention's _extra_state), or the resumed step would cast with scale 1.
TEST(Checkpointing, ExactResumeFp8Attention) {
  check_exact_resume({"--hidden-size", "64", "--attention-dropout", "0", "--fp8-format", "hybrid",
                      "--fp8-dot-product-attention"});
}

TEST(Checkpointing, ExactResumePrecisionAwareBf16States) {
  check_exact_resume(with(kBf16OptimizerStates, {"--main-grads-dtype", "bf16"}));
}

// fp8 first and fp16 second moments, scaled per parameter: checkpoints hold fp32 copies (as
// Megatron's hold Transformer Engine's unscaled states) that store back to the same bits and
// scales, so the run resumes bitwise from fp8tron's format and from torch_dist.
TEST(Checkpointing, ExactResumePrecisionAwareScaledStates) {
  const std::vector<std::string> scaled = {"--bf16", "--use-distributed-optimizer", "--use-precision-aware-optimizer",
                                           "--exp-avg-dtype", "fp8", "--exp-avg-sq-dtype", "fp16"};
  check_exact_resume(scaled);
  check_exact_resume(with(scaled, {"--ckpt-format", "torch_dist", "--hidden-dropout", "0", "--attention-dropout", "0"}));
}

// fp16 main weights: their fp32 copies store back to the same bits, and the model weights are
// read as saved (the step wrote them before the rounding to fp16).
TEST(Checkpointing, ExactResumePrecisionAwareFp16MainWeights) {
  const std::vector<std::string> fp16_main = {"--bf16", "--use-distributed-optimizer", "--use-precision-aware-optimizer",
                                              "--main-params-dtype", "fp16", "--exp-avg-dtype", "fp16"};
  check_exact_resume(fp16_main);
  check_exact_resume(with(fp16_main, {"--ckpt-format", "torch_dist", "--hidden-dropout", "0", "--attention-dropout", "0"}));
}

TEST(Checkpointing, ExactResumeSgd) { check_exact_resume({"--optimizer", "sgd", "--lr", "0.1"}); }

// Muon: its matrices' momentum, and Adam's two moments for the parameters it does not take
// (embeddings, norms, biases), under their own names.
TEST(Checkpointing, ExactResumeMuonWithItsScalarAdam) {
  check_exact_resume({"--optimizer", "muon", "--muon-fp32-matmul-prec", "high"});
  TempDir dir;
  run({"--optimizer", "muon", "--train-iters", "2", "--save", dir.path()});
  const auto m = checkpoint::read_metadata(checkpoint::locate_latest_checkpoint(dir.path()).path);
  EXPECT_TRUE(m.tensors.count("optimizer.state.momentum_buffer.decoder.layers.1.mlp.linear_fc1.weight"));
  EXPECT_FALSE(m.tensors.count("optimizer.state.exp_avg.decoder.layers.1.mlp.linear_fc1.weight"));
  EXPECT_FALSE(m.tensors.count("optimizer.state.exp_avg_sq.decoder.layers.1.mlp.linear_fc1.weight"));
  EXPECT_TRUE(m.tensors.count("optimizer.state.exp_avg.embedding.word_embeddings.weight"));
  EXPECT_TRUE(m.tensors.count("optimizer.state.exp_avg_sq.decoder.final_layernorm.weight"));
}

TEST(Checkpointing, ExactResumeAfterAsynchronousSaves) {
  check_exact_resume({"--bf16"}, {"--async-save", "--save-interval", "3"});
}

TEST(Checkpointing, ExactResumeInDeterministicMode) {
  check_exact_resume({"--bf16", "--deterministic-mode", "--hidden-dropout", "0.1"});
}

TEST(Checkpointing, AsynchronousSavesAreAllCommitted) {
  TempDir dir;
  TrainResult r = run({"--train-iters", "10", "--save", dir.path(), "--save-interval", "2", "--async-save"});
  EXPECT_EQ(checkpoint::list_checkpoint_iterations(dir.path()), (std::vector<int64_t>{2, 4, 6, 8, 10}));
  EXPECT_EQ(checkpoint::read_tracker(dir.path())->iteration, 10);
  // Each is complete and what training had at that iteration: resuming from 6 replays 7..10.
  TrainResult resumed = run({"--train-iters", "10", "--load", dir.path(), "--ckpt-step", "6"});
  EXPECT_EQ(std::vector<double>(r.losses.begin() + 6, r.losses.end()), resumed.losses);
}

// The training state of one process without the training loop: a model, its optimizer (with
// state that differs per element), schedule, scaler and counters.
class StateRig {
 public:
  explicit StateRig(Config c)
      : config_(std::move(c)), parallel_(single_process_state()), model_(config_.model), schedule_(config_.lr_schedule),
        scaler_(config_.precision) {
    std::vector<NamedParam> params;
    const auto infos = model_->param_infos();
    for (const auto& item : model_->named_parameters()) params.push_back({item.key(), item.value(), infos.at(item.key())});
    optimizer_ = std::make_unique<MixedPrecisionOptimizer>(params, config_.optimizer, config_.precision, parallel_, false);
  }
  void scramble(uint64_t seed) {
    torch::NoGradGuard no_grad;
    torch::manual_seed(seed);
    const auto& dense = *optimizer_->domains().front();
    dense.main_params().normal_();
    dense.exp_avg().normal_();
    dense.exp_avg_sq().uniform_();
    optimizer_->set_step_count(double(seed));
    optimizer_->publish_model_params();
    schedule_.set_num_steps(int64_t(seed) * 4);
  }
  TrainingState state() {
    return {config_, parallel_, torch::Device(torch::kCPU), *optimizer_, schedule_, scaler_, train_samples_,
            valid_samples_};
  }
  const MixedPrecisionOptimizer& optimizer() const { return *optimizer_; }

 private:
  Config config_;
  ParallelState parallel_;
  GptModel model_;
  std::unique_ptr<MixedPrecisionOptimizer> optimizer_;
  LrSchedule schedule_;
  LossScaler scaler_;
  int64_t train_samples_ = 0, valid_samples_ = 0;
};

void expect_same_state(const MixedPrecisionOptimizer& a_chain, const MixedPrecisionOptimizer& b_chain) {
  ASSERT_EQ(a_chain.domains().size(), b_chain.domains().size());
  for (size_t i = 0; i < a_chain.domains().size(); ++i) {
    const auto& a = *a_chain.domains()[i];
    const auto& b = *b_chain.domains()[i];
    EXPECT_TRUE(torch::equal(a.model_params(), b.model_params()));
    EXPECT_TRUE(torch::equal(a.main_params(), b.main_params()));
    EXPECT_TRUE(torch::equal(a.exp_avg(), b.exp_avg()));
    EXPECT_TRUE(torch::equal(a.exp_avg_sq(), b.exp_avg_sq()));
    EXPECT_EQ(a.step_count(), b.step_count());
  }
}

TEST(AsyncCheckpointSaver, FirstSaveUsesHostMemoryReservedBeforeIt) {
  TempDir dir;
  StateRig rig(checkpoint_config({"--bf16", "--save", dir.path(), "--async-save"}));
  rig.scramble(3);
  const int64_t n = rig.optimizer().num_parameters();
  AsyncCheckpointSaver saver;
  saver.reserve(rig.state());
  saver.save(rig.state(), 1);
  saver.finalize(rig.state(), /*blocking=*/true);
  const AsyncSaveStats& stats = saver.stats();
  // bf16 weights, fp32 main weights and two Adam moments: four buffers, all made by reserve().
  EXPECT_EQ(stats.buffers_reserved, 4);
  EXPECT_EQ(stats.bytes_reserved, n * 2 + 3 * n * 4);
  EXPECT_EQ(stats.buffers_allocated_by_saves, 0) << "the first save allocated host memory";
  EXPECT_EQ(stats.last_copied_bytes, stats.bytes_reserved);
  EXPECT_GE(stats.last_blocked_seconds, stats.last_copy_seconds);
  // Later saves reuse the same memory, and each checkpoint holds the state of its iteration.
  rig.scramble(5);
  saver.save(rig.state(), 2);
  rig.scramble(7);  // training moves on while the writer works: the snapshot must not see it
  saver.finalize(rig.state(), true);
  EXPECT_EQ(stats.buffers_allocated_by_saves, 0);
  EXPECT_EQ(stats.saves, 2);
  StateRig expected(checkpoint_config({"--bf16"}));
  expected.scramble(5);
  StateRig loaded(checkpoint_config({"--bf16", "--load", dir.path()}));
  EXPECT_EQ(load_checkpoint(loaded.state()), 2);
  expect_same_state(loaded.optimizer(), expected.optimizer());
}

TEST(AsyncCheckpointSaver, SaveOfOtherSizesThanReservedAllocatesWhatItNeeds) {
  TempDir dir;
  StateRig reserved_for(checkpoint_config({"--save", dir.path(), "--async-save"}));  // fp32: three buffers
  StateRig larger(checkpoint_config({"--bf16", "--hidden-size", "64", "--save", dir.path(), "--async-save"}));
  larger.scramble(11);
  AsyncCheckpointSaver saver;
  saver.reserve(reserved_for.state());
  saver.save(larger.state(), 4);
  saver.finalize(larger.state(), true);
  EXPECT_EQ(saver.stats().buffers_reserved, 3);
  EXPECT_EQ(saver.stats().buffers_allocated_by_saves, 4);
  StateRig loaded(checkpoint_config({"--bf16", "--hidden-size", "64", "--load", dir.path()}));
  EXPECT_EQ(load_checkpoint(loaded.state()), 4);
  expect_same_state(loaded.optimizer(), larger.optimizer());
}

// Optimizer states saved in another dtype than the loading run's are converted as they are read:
// fp32 moments rounded to nearest-even into bf16 ones, bf16 moments widened exactly into fp32 ones.
TEST(Checkpointing, OptimizerStatesOfAnotherDtypeAreConverted) {
  TempDir fp32_dir, bf16_dir;
  StateRig fp32(checkpoint_config({"--bf16", "--save", fp32_dir.path()}));
  fp32.scramble(3);
  save_checkpoint(fp32.state(), 1);
  StateRig narrowed(checkpoint_config(with(kBf16OptimizerStates, {"--load", fp32_dir.path()})));
  EXPECT_EQ(load_checkpoint(narrowed.state()), 1);
  const auto& saved = *fp32.optimizer().domains().front();
  const auto& narrow = *narrowed.optimizer().domains().front();
  ASSERT_EQ(narrow.exp_avg().scalar_type(), torch::kBFloat16);
  EXPECT_TRUE(torch::equal(narrow.exp_avg(), saved.exp_avg().to(torch::kBFloat16)));
  EXPECT_TRUE(torch::equal(narrow.exp_avg_sq(), saved.exp_avg_sq().to(torch::kBFloat16)));
  EXPECT_TRUE(torch::equal(narrow.main_params(), saved.main_params()));

  StateRig bf16(checkpoint_config(with(kBf16OptimizerStates, {"--save", bf16_dir.path()})));
  bf16.scramble(5);
  save_checkpoint(bf16.state(), 2);
  EXPECT_EQ(checkpoint::read_metadata(bf16_dir.path() + "/iter_0000002")
                .tensors.at("optimizer.state.exp_avg.decoder.final_layernorm.weight")
                .dtype,
            checkpoint::DType::BF16);
  StateRig widened(checkpoint_config({"--bf16", "--load", bf16_dir.path()}));
  EXPECT_EQ(load_checkpoint(widened.state()), 2);
  const auto& wide = *widened.optimizer().domains().front();
  const auto& saved_bf16 = *bf16.optimizer().domains().front();
  ASSERT_EQ(wide.exp_avg().scalar_type(), torch::kFloat32);
  EXPECT_TRUE(torch::equal(wide.exp_avg(), saved_bf16.exp_avg().to(torch::kFloat32)));
  EXPECT_TRUE(torch::equal(wide.exp_avg_sq(), saved_bf16.exp_avg_sq().to(torch::kFloat32)));
}

TEST(Checkpointing, LayoutAndMetadata) {
  TempDir dir;
  TrainResult r = run({"--train-iters", "10", "--save", dir.path(), "--save-interval", "4", "--bf16"});
  // Every --save-interval, and at the end of training.
  EXPECT_EQ(checkpoint::list_checkpoint_iterations(dir.path()), (std::vector<int64_t>{4, 8, 10}));
  EXPECT_EQ(checkpoint::read_tracker(dir.path())->iteration, 10);
  checkpoint::CheckpointLocation location = checkpoint::locate_latest_checkpoint(dir.path());
  EXPECT_EQ(location.path, dir / "iter_0000010");
  EXPECT_EQ(checkpoint::list_checkpoint_files(location),
            (std::vector<std::string>{"fp8tron_checkpoint.json", "rank_00000.safetensors"}));
  const auto m = checkpoint::read_metadata(location.path);
  EXPECT_EQ(m.iteration, 10);
  EXPECT_EQ(m.consumed_train_samples, 40);
  EXPECT_EQ(m.lr_scheduler_num_steps, 40);
  EXPECT_EQ(m.consumed_valid_samples, 2 * 4);  // evaluations at iterations 5 and 10
  EXPECT_EQ(m.args.at("hidden-size"), "32");
  EXPECT_EQ(m.args.at("model.hidden_size"), "32");
  ASSERT_EQ(m.rng.size(), 1u);
  EXPECT_EQ(m.rng[0].name, "cpu");
  const auto& w = m.tensors.at("decoder.layers.1.mlp.linear_fc1.weight");
  EXPECT_EQ(w.dtype, checkpoint::DType::BF16);
  EXPECT_EQ(w.shape, (std::vector<int64_t>{128, 32}));
  EXPECT_EQ(m.tensors.at("optimizer.state.fp32_param.decoder.layers.1.mlp.linear_fc1.weight").dtype, checkpoint::DType::F32);
  EXPECT_TRUE(m.tensors.count("optimizer.state.exp_avg.embedding.word_embeddings.weight"));
  EXPECT_TRUE(m.tensors.count("optimizer.state.exp_avg_sq.decoder.final_layernorm.weight"));
  EXPECT_TRUE(m.tensors.count("optimizer.state.step"));
  // The stored weights are the trained model's.
  checkpoint::CheckpointReader reader(location);
  auto fc1 = torch::empty({128, 32}, torch::kBFloat16);
  reader.read("decoder.layers.1.mlp.linear_fc1.weight", checkpoint::DType::BF16, {128, 32}, checkpoint::whole({128, 32}),
              fc1.data_ptr());
  EXPECT_TRUE(torch::equal(fc1.to(torch::kFloat32), r.final_weights.at("decoder.layers.1.mlp.linear_fc1.weight")));
}

TEST(Checkpointing, ResavingAnIterationReplacesIt) {
  TempDir dir;
  run({"--train-iters", "2", "--save", dir.path()});
  // A run that resumed from the directory (here weights only, from iteration 0) saves iteration 2 again.
  TrainResult second = run({"--train-iters", "2", "--load", dir.path(), "--finetune", "--save", dir.path(), "--seed", "7"});
  EXPECT_EQ(checkpoint::list_checkpoint_iterations(dir.path()), (std::vector<int64_t>{2}));
  EXPECT_EQ(checkpoint::read_metadata(dir / "iter_0000002").args.at("seed"), "7");
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir.path()), std::filesystem::directory_iterator()), 3)
      << "only iter_0000002, the tracker and the lock file: the replaced copy is deleted";
}

TEST(Checkpointing, MismatchedModelIsAClearError) {
  TempDir dir;
  run({"--train-iters", "2", "--save", dir.path()});
  EXPECT_USER_ERROR(run({"--train-iters", "4", "--load", dir.path(), "--hidden-size", "64"}),
                    "was saved from a different model: hidden_size is 32 in the checkpoint but 64 here (--hidden-size)");
  EXPECT_USER_ERROR(run({"--train-iters", "4", "--load", dir.path(), "--optimizer", "sgd"}),
                    "was saved with --optimizer adam but this run uses sgd");
}

TEST(Checkpointing, CorruptOrIncompleteCheckpointIsAClearError) {
  TempDir dir;
  run({"--train-iters", "2", "--save", dir.path()});
  const std::string iter = dir / "iter_0000002";
  const std::string shard = iter + "/rank_00000.safetensors";
  const std::string bytes = checkpoint::testing::slurp(shard);
  checkpoint::testing::spit(shard, bytes.substr(0, bytes.size() / 2));
  EXPECT_USER_ERROR(run({"--train-iters", "4", "--load", dir.path()}), "rank_00000.safetensors");
  std::filesystem::remove(shard);
  EXPECT_USER_ERROR(run({"--train-iters", "4", "--load", dir.path()}), "shard file rank_00000.safetensors is missing");
  checkpoint::testing::spit(iter + "/fp8tron_checkpoint.json", "{\"format\": \"fp8tron-checkpoint\", ");
  EXPECT_USER_ERROR(run({"--train-iters", "4", "--load", dir.path()}), "not valid JSON");
  checkpoint::testing::spit(dir / "latest_checkpointed_iteration.txt", "7");
  EXPECT_USER_ERROR(run({"--train-iters", "4", "--load", dir.path()}), "iter_0000007");
}

TEST(Checkpointing, FinetuneLoadsWeightsOnlyAndStartsAtIterationZero) {
  TempDir dir;
  TrainResult first = run({"--train-iters", "10", "--save", dir.path()});
  TrainResult fresh = run({"--train-iters", "3"});
  TrainResult tuned = run({"--train-iters", "3", "--load", dir.path(), "--finetune"});
  EXPECT_EQ(tuned.iterations, 3);
  EXPECT_EQ(tuned.losses.size(), 3u);
  EXPECT_EQ(tuned.consumed_samples, 12);
  // Trained weights on the same first batches: lower loss than a fresh model.
  EXPECT_LT(tuned.losses[0], fresh.losses[0] - 0.05);
  // --no-load-optim keeps the iteration (and consumed samples) but not the optimizer.
  TrainResult no_optim = run({"--train-iters", "12", "--load", dir.path(), "--no-load-optim"});
  EXPECT_EQ(no_optim.iterations, 12);
  EXPECT_EQ(no_optim.losses.size(), 2u);
  EXPECT_EQ(no_optim.consumed_samples, 48);
}

TEST(Checkpointing, PretrainedCheckpointStartsAFinetuneUntilLoadHoldsOne) {
  // Megatron's rule: with --load empty, the run fine-tunes from --pretrained-checkpoint (as
  // --finetune loads it); once --load holds a checkpoint, that one is resumed.
  TempDir pretrained, tuning;
  run({"--train-iters", "10", "--save", pretrained.path()});
  const TrainResult by_flag = run({"--train-iters", "3", "--load", pretrained.path(), "--finetune"});
  const TrainResult first = run({"--train-iters", "3", "--load", tuning.path(), "--save", tuning.path(),
                                 "--pretrained-checkpoint", pretrained.path()});
  EXPECT_EQ(first.losses, by_flag.losses);
  EXPECT_EQ(first.iterations, 3);
  EXPECT_EQ(first.consumed_samples, 12);
  // The next job resumes its own checkpoint, not the pretrained one (as without the flag).
  const TrainResult own = run({"--train-iters", "5", "--load", tuning.path(), "--use-checkpoint-opt_param-scheduler"});
  const TrainResult second = run({"--train-iters", "5", "--load", tuning.path(), "--save", tuning.path(),
                                  "--pretrained-checkpoint", pretrained.path(), "--use-checkpoint-opt_param-scheduler"});
  EXPECT_EQ(second.iterations, 5);
  ASSERT_EQ(second.losses.size(), 2u);
  EXPECT_EQ(second.losses, own.losses);
  // Neither holds a checkpoint: one line naming both.
  TempDir empty;
  EXPECT_USER_ERROR(run({"--train-iters", "3", "--pretrained-checkpoint", empty.path()}),
                    "no checkpoint found in the load directory or the pretrained directory");
}

TEST(Checkpointing, OverrideCkptIterationReplaysFromThatIteration) {
  // The checkpoint of iteration 10 continues as iteration 4: the data loader replays the samples of
  // iterations 5.. (consumed = 4 x global batch), the weights and optimizer are the checkpoint's.
  TempDir dir;
  run({"--train-iters", "10", "--save", dir.path()});
  const TrainResult replay = run({"--train-iters", "6", "--load", dir.path(), "--override-ckpt-iteration", "4",
                                  "--use-checkpoint-opt_param-scheduler"});
  EXPECT_EQ(replay.iterations, 6);
  ASSERT_EQ(replay.losses.size(), 2u);
  EXPECT_EQ(replay.consumed_samples, 6 * 4);
  // The same samples as the first run's iterations 5 and 6, on the trained weights: lower losses.
  const TrainResult original = run({"--train-iters", "6"});
  EXPECT_LT(replay.losses[0], original.losses[4] - 0.05);
  EXPECT_USER_ERROR(run({"--train-iters", "6", "--load", dir.path(), "--override-ckpt-iteration", "4", "--finetune"}),
                    "--override-ckpt-iteration cannot be used with --finetune");
}

TEST(Checkpointing, SaveRetainIntervalKeepsMultiplesAndTheLatest) {
  for (const char* mode : {"--save-interval", "--persistent-save-interval"}) {  // Megatron's two names
    TempDir dir, async_dir;
    run({"--train-iters", "10", "--save", dir.path(), mode, "2", "--save-retain-interval", "4"});
    // Each save deletes the previous latest unless it is a multiple of 4: 2 and 6 go.
    EXPECT_EQ(checkpoint::list_checkpoint_iterations(dir.path()), (std::vector<int64_t>{4, 8, 10})) << mode;
    run({"--train-iters", "10", "--save", async_dir.path(), mode, "2", "--save-retain-interval", "4", "--async-save"});
    EXPECT_EQ(checkpoint::list_checkpoint_iterations(async_dir.path()), (std::vector<int64_t>{4, 8, 10})) << mode;
  }
}

TEST(Checkpointing, NonPersistentCheckpointsKeepOnlyTheNewestAndLoadWhenNewer) {
  TempDir dir;
  const std::vector<std::string> np = {"--non-persistent-ckpt-type", "global"};
  TrainResult straight =
      run(with({"--train-iters", "10", "--save", dir.path(), "--save-interval", "4", "--non-persistent-save-interval", "3"},
               np));
  // Persistent at 4, 8 and the end; non-persistent at 3, 6, 9 (only the newest kept) in <save>/non_persistent.
  EXPECT_EQ(checkpoint::list_checkpoint_iterations(dir.path()), (std::vector<int64_t>{4, 8, 10}));
  EXPECT_EQ(checkpoint::list_checkpoint_iterations(dir / "non_persistent"), (std::vector<int64_t>{9}));
  EXPECT_EQ(checkpoint::read_tracker(dir / "non_persistent")->iteration, 9);
  // As Megatron: the non-persistent checkpoint is taken when it is at least as new as the
  // persistent one asked for (here --ckpt-step 8), and resumes exactly.
  TrainResult from_np = run(with({"--train-iters", "10", "--load", dir.path(), "--ckpt-step", "8"}, np));
  ASSERT_EQ(from_np.losses.size(), 1u);
  EXPECT_EQ(from_np.losses[0], straight.losses[9]);
  EXPECT_EQ(run({"--train-iters", "10", "--load", dir.path(), "--ckpt-step", "8"}).losses.size(), 2u);
  EXPECT_EQ(run(with({"--train-iters", "12", "--load", dir.path(), "--override-opt-param-scheduler"}, np)).losses.size(), 2u)
      << "10 is newer than 9";
  // An explicit directory.
  TempDir elsewhere, new_save;
  run(with({"--train-iters", "4", "--save", new_save.path(), "--non-persistent-save-interval", "2",
            "--non-persistent-global-ckpt-dir", elsewhere.path()},
           np));
  EXPECT_EQ(checkpoint::list_checkpoint_iterations(elsewhere.path()), (std::vector<int64_t>{4}));
}

// Megatron's torch_dist format written as fp8tron's own: in the background (--async-save, which
// Megatron allows with torch_dist only), pruned by --save-retain-interval, and as non-persistent
// checkpoints.
const std::vector<std::string> kTorchDist = {"--ckpt-format", "torch_dist", "--hidden-dropout", "0",
                                             "--attention-dropout", "0"};

bool holds_torch_dist(const std::filesystem::path& dir, int64_t iteration) {
  const auto at = dir / checkpoint::checkpoint_dir_name(iteration);
  return std::filesystem::exists(at / ".metadata") && std::filesystem::exists(at / "__0_0.distcp") &&
         !std::filesystem::exists(at / "fp8tron_checkpoint.json");
}

TEST(Checkpointing, TorchDistAsynchronousSavesResumeExactly) {
  check_exact_resume(with({"--bf16"}, kTorchDist), {"--async-save", "--save-interval", "3"});
  TempDir dir;
  TrainResult r = run(with({"--train-iters", "10", "--save", dir.path(), "--save-interval", "2", "--async-save"}, kTorchDist));
  EXPECT_EQ(checkpoint::list_checkpoint_iterations(dir.path()), (std::vector<int64_t>{2, 4, 6, 8, 10}));
  for (int64_t it : {2, 6, 10}) EXPECT_TRUE(holds_torch_dist(dir.path(), it)) << it;
  // Each is what training had at that iteration, though training went on while it was written.
  TrainResult resumed = run(with({"--train-iters", "10", "--load", dir.path(), "--ckpt-step", "6"}, kTorchDist));
  EXPECT_EQ(std::vector<double>(r.losses.begin() + 6, r.losses.end()), resumed.losses);
}

// fp8tron's own RNG states ride in the common state under a key Megatron does not read: a run with
// dropout resumes bitwise from its torch_dist checkpoint in the same layout; without them
// (--no-save-rng) the random streams restart from --seed and the losses differ.
TEST(Checkpointing, TorchDistKeepsFp8tronsRngStates) {
  const std::vector<std::string> dropout = {"--bf16", "--ckpt-format", "torch_dist", "--hidden-dropout", "0.1",
                                            "--attention-dropout", "0.1"};
  check_exact_resume(dropout);
  TempDir dir;
  const auto base = with(dropout, {"--train-iters", "20"});
  TrainResult straight = run(base);
  run(with(base, {"--exit-interval", "10", "--save", dir.path(), "--no-save-rng"}));
  TrainResult resumed = run(with(base, {"--load", dir.path()}));
  ASSERT_EQ(resumed.losses.size(), 10u);
  EXPECT_NE(std::vector<double>(straight.losses.begin() + 10, straight.losses.end()), resumed.losses);
}

TEST(Checkpointing, TorchDistSaveRetainInterval) {
  for (bool async : {false, true}) {
    TempDir dir;
    auto args = with({"--train-iters", "10", "--save", dir.path(), "--save-interval", "2", "--save-retain-interval", "4"},
                     kTorchDist);
    if (async) args.push_back("--async-save");
    run(args);
    EXPECT_EQ(checkpoint::list_checkpoint_iterations(dir.path()), (std::vector<int64_t>{4, 8, 10})) << async;
    EXPECT_TRUE(holds_torch_dist(dir.path(), 8)) << async;
  }
}

TEST(Checkpointing, TorchDistNonPersistentCheckpoints) {
  TempDir dir;
  const auto np = with({"--non-persistent-ckpt-type", "global"}, kTorchDist);
  TrainResult straight =
      run(with({"--train-iters", "10", "--save", dir.path(), "--save-interval", "4", "--non-persistent-save-interval", "3"},
               np));
  EXPECT_EQ(checkpoint::list_checkpoint_iterations(dir.path()), (std::vector<int64_t>{4, 8, 10}));
  EXPECT_EQ(checkpoint::list_checkpoint_iterations(dir / "non_persistent"), (std::vector<int64_t>{9}));
  EXPECT_TRUE(holds_torch_dist(dir / "non_persistent", 9));
  TrainResult from_np = run(with({"--train-iters", "10", "--load", dir.path(), "--ckpt-step", "8"}, np));
  ASSERT_EQ(from_np.losses.size(), 1u);
  EXPECT_EQ(from_np.losses[0], straight.losses[9]);
}

// Megatron's own checkpoints load (tests/checkpoint/megatron_resume_test.sh); incomplete ones,
// and formats fp8tron does not read, fail naming the file or the format.
TEST(Checkpointing, MegatronCheckpointProblemsAreNamed) {
  TempDir dir;
  checkpoint::testing::spit(dir / "latest_checkpointed_iteration.txt", "5");
  std::filesystem::create_directories(dir / "iter_0000005");
  checkpoint::testing::spit(dir / "iter_0000005/metadata.json", "{\"sharded_backend\": \"torch_dist\", "
                                                               "\"sharded_backend_version\": 1}");
  EXPECT_USER_ERROR(run({"--train-iters", "6", "--load", dir.path(), "--auto-detect-ckpt-format"}),
                    "iter_0000005/.metadata: cannot be opened");
  // A damaged checkpoint is refused with the other complete iterations to load instead.
  std::filesystem::create_directories(dir / "iter_0000003");
  const std::string others = "; load another complete iteration with --ckpt-step N (complete iterations: 3)";
  EXPECT_USER_ERROR(run({"--train-iters", "6", "--load", dir.path(), "--auto-detect-ckpt-format"}),
                    "is the checkpoint complete?" + others);
  checkpoint::testing::spit(dir / "iter_0000005/.metadata", std::string("\x80\x02\xc8garbage", 10));
  EXPECT_USER_ERROR(run({"--train-iters", "6", "--load", dir.path(), "--auto-detect-ckpt-format"}), others);
  checkpoint::remove_tree(dir / "iter_0000003");
  checkpoint::testing::spit(dir / "iter_0000005/metadata.json", "{\"sharded_backend\": \"zarr\"}");
  EXPECT_USER_ERROR(run({"--train-iters", "6", "--load", dir.path()}), "is in Megatron's zarr format");
  TempDir legacy;
  checkpoint::testing::spit(legacy / "latest_checkpointed_iteration.txt", "5");
  std::filesystem::create_directories(legacy / "iter_0000005/mp_rank_00");
  EXPECT_USER_ERROR(run({"--train-iters", "6", "--load", legacy.path()}), "mp_rank_00/model_optim_rng.pt");
}

TEST(Checkpointing, DistCkptStrictnessHandlesTensorMismatches) {
  TempDir dir;
  run({"--train-iters", "4", "--save", dir.path()});
  const std::string iter = dir / "iter_0000004";
  auto m = checkpoint::read_metadata(iter);
  const std::string gone = "optimizer.state.exp_avg.decoder.final_layernorm.weight";
  const auto kept = m.tensors.at(gone);
  m.tensors.erase(gone);
  m.tensors["extra.weight"] = m.tensors.at("decoder.final_layernorm.weight");
  checkpoint::write_metadata(iter, m);
  auto resume = [&](const std::string& strictness) {
    return run({"--train-iters", "6", "--load", dir.path(), "--dist-ckpt-strictness", strictness,
                "--override-opt-param-scheduler"});
  };
  // A tensor the model needs is absent: the default fails reading it, raise_* before reading.
  EXPECT_USER_ERROR(resume("assume_ok_unexpected"), "has no tensor '" + gone + "'");
  EXPECT_USER_ERROR(resume("raise_unexpected"),
                    "lacks tensors this model needs (--dist-ckpt-strictness raise_unexpected): " + gone);
  EXPECT_USER_ERROR(resume("raise_all"), "lacks tensors this model needs");
  for (const char* lenient : {"log_unexpected", "log_all", "return_unexpected", "return_all", "ignore_all"})
    EXPECT_EQ(resume(lenient).losses.size(), 2u) << lenient;
  // Only a tensor no rank reads: raise_all refuses it, the others load.
  m.tensors[gone] = kept;
  checkpoint::write_metadata(iter, m);
  EXPECT_USER_ERROR(resume("raise_all"),
                    "holds tensors this model does not read (--dist-ckpt-strictness raise_all): extra.weight");
  EXPECT_EQ(resume("raise_unexpected").losses.size(), 2u);
  EXPECT_EQ(resume("assume_ok_unexpected").losses.size(), 2u);
}

TEST(Checkpointing, NoSaveOptimAndNoSaveRng) {
  TempDir dir;
  run({"--train-iters", "4", "--save", dir.path(), "--no-save-optim", "--no-save-rng"});
  const auto m = checkpoint::read_metadata(dir / "iter_0000004");
  EXPECT_FALSE(m.tensors.count("optimizer.state.step"));
  EXPECT_TRUE(m.rng.empty());
  EXPECT_USER_ERROR(run({"--train-iters", "6", "--load", dir.path()}), "pass --no-load-optim or --finetune");
  EXPECT_USER_ERROR(run({"--train-iters", "6", "--load", dir.path(), "--no-load-optim"}), "pass --no-load-rng");
  EXPECT_EQ(run({"--train-iters", "6", "--load", dir.path(), "--no-load-optim", "--no-load-rng"}).losses.size(), 2u);
}

TEST(Checkpointing, MissingCheckpointStartsFromScratchUnlessAskedToExit) {
  TempDir dir;
  EXPECT_EQ(run({"--train-iters", "2", "--load", dir.path()}).losses.size(), 2u);
  EXPECT_USER_ERROR(run({"--train-iters", "2", "--load", dir.path(), "--exit-on-missing-checkpoint"}),
                    "--exit-on-missing-checkpoint");
}

TEST(Checkpointing, CkptStepLoadsAnOlderIteration) {
  TempDir dir;
  TrainResult straight = run({"--train-iters", "8"});
  run({"--train-iters", "8", "--save", dir.path(), "--save-interval", "3"});
  TrainResult resumed = run({"--train-iters", "8", "--load", dir.path(), "--ckpt-step", "3"});
  EXPECT_EQ(std::vector<double>(straight.losses.begin() + 3, straight.losses.end()), resumed.losses);
}

TEST(Checkpointing, UseCheckpointArgsTakesTheModelFromTheCheckpoint) {
  TempDir dir;
  // (The built-in data needs no tokenizer file; the checkpoint records the flag all the same.)
  run({"--train-iters", "2", "--save", dir.path(), "--swiglu", "--num-layers", "3", "--tokenizer-model", "/data/t.model"});
  auto args = with(tiny_args({"--global-batch-size", "4", "--lr", "3e-3", "--log-interval", "1000", "--eval-iters", "0",
                              "--train-iters", "4", "--hidden-size", "64"}),
                   {"--load", dir.path(), "--use-checkpoint-args", "--override-opt-param-scheduler"});
  FlagValues keep_tokenizer = parse(with(args, {"--no-use-tokenizer-model-from-checkpoint-args"}));
  apply_checkpoint_args(keep_tokenizer);
  EXPECT_EQ(keep_tokenizer.get_string("tokenizer-model"), "");
  EXPECT_EQ(keep_tokenizer.get_int("num-layers"), 3);
  FlagValues flags = parse(args);
  apply_checkpoint_args(flags);
  const Config c = build_config(flags, LaunchEnv{}, false);
  EXPECT_EQ(c.data.tokenizer_model, "/data/t.model");  // as Megatron, unless told not to
  EXPECT_EQ(c.model.hidden_size, 32);
  EXPECT_EQ(c.model.num_layers, 3);
  EXPECT_TRUE(c.model.swiglu);
  EXPECT_EQ(train(c).iterations, 4);
  FlagValues no_load = parse(tiny_args({"--use-checkpoint-args"}));
  EXPECT_USER_ERROR(apply_checkpoint_args(no_load), "--use-checkpoint-args needs --load");
}

// --use-mp-args-from-checkpoint-args: the saved run's parallel layout too (Megatron's fixture
// saved by TP2 x PP2), forced over this run's, a virtual pipeline only when the run asks for none;
// without --use-checkpoint-args it does nothing.
TEST(Checkpointing, UseMpArgsFromCheckpointArgsTakesTheParallelLayout) {
  const std::string fixture = std::string(FP8TRON_SOURCE_DIR) + "/tests/fixtures/megatron_checkpoints/gpt_tp2pp2_torch_dist/ckpt";
  FlagValues flags = parse(tiny_args({"--load", fixture, "--use-checkpoint-args", "--use-mp-args-from-checkpoint-args",
                                      "--tensor-model-parallel-size", "4", "--num-layers-per-virtual-pipeline-stage", "1"}));
  apply_checkpoint_args(flags);
  EXPECT_EQ(flags.get_int("tensor-model-parallel-size"), 2);
  EXPECT_EQ(flags.get_int("pipeline-model-parallel-size"), 2);
  EXPECT_EQ(flags.get_int("expert-model-parallel-size"), 1);
  EXPECT_EQ(flags.get_int("num-layers-per-virtual-pipeline-stage"), 1) << "this run's virtual pipeline stays";
  EXPECT_EQ(flags.get_int("num-layers"), 2);
  FlagValues layout_only = parse(tiny_args({"--load", fixture, "--use-mp-args-from-checkpoint-args",
                                            "--tensor-model-parallel-size", "4"}));
  apply_checkpoint_args(layout_only);
  EXPECT_EQ(layout_only.get_int("tensor-model-parallel-size"), 4);
}

// Sends `signal` to this process once a handler for it is installed (the trainer's), unless the
// run ends first; joined by its destructor.
class SignalWhenHandled {
 public:
  explicit SignalWhenHandled(int signal)
      : sender_([this, signal] {
          while (!done_) {
            struct sigaction current {};
            sigaction(signal, nullptr, &current);
            if (current.sa_handler != SIG_DFL && current.sa_handler != SIG_IGN) {
              std::this_thread::sleep_for(std::chrono::milliseconds(200));
              kill(getpid(), signal);
              return;
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(5));
          }
        }) {}
  ~SignalWhenHandled() {
    done_ = true;
    sender_.join();
  }

 private:
  std::atomic<bool> done_{false};
  std::thread sender_;
};

bool default_handler(int signal) {
  struct sigaction after {};
  sigaction(signal, nullptr, &after);
  return after.sa_handler == SIG_DFL;
}

TEST(Checkpointing, ExitSignalSavesAndExitsCleanly) {
  TempDir dir;
  TrainResult r;
  {
    SignalWhenHandled sigterm(SIGTERM);
    r = run({"--train-iters", "100000", "--save", dir.path(), "--exit-signal-handler"});
  }
  EXPECT_LT(r.iterations, 100000);
  ASSERT_TRUE(checkpoint::read_tracker(dir.path()));
  EXPECT_EQ(checkpoint::read_tracker(dir.path())->iteration, r.iterations);
  EXPECT_TRUE(default_handler(SIGTERM)) << "the previous handler is restored";
}

// --exit-signal-handler-for-training: SIGINT (or SIGTERM) ends training in order at the next
// iteration, saving nothing.
TEST(Checkpointing, ExitSignalHandlerForTrainingStopsWithoutSaving) {
  TempDir dir;
  TrainResult r;
  {
    SignalWhenHandled sigint(SIGINT);
    r = run({"--train-iters", "100000", "--save", dir.path(), "--save-interval", "100000",
             "--exit-signal-handler-for-training"});
  }
  EXPECT_LT(r.iterations, 100000);
  EXPECT_FALSE(checkpoint::read_tracker(dir.path())) << "nothing saved";
  EXPECT_TRUE(default_handler(SIGINT));
  EXPECT_TRUE(default_handler(SIGTERM));
}

}  // namespace
}  // namespace fp8tron
