// Checkpoint save and resume through the trainer (one process, CPU): exact resume, the flags
// around it, and the errors users see. Multi-process layouts and resharding: checkpoint_resume.cpp.
#include <gtest/gtest.h>

#include <signal.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <thread>

#include "checkpoint/temp_dir.h"
#include "test_helpers.h"
#include "trainer/checkpoint/checkpoint_dir.h"
#include "trainer/checkpoint/metadata.h"
#include "trainer/checkpoint/sharded_io.h"
#include "trainer/checkpoint_args.h"
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

std::vector<std::string> with(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
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

TEST(Checkpointing, ExactResumeSgd) { check_exact_resume({"--optimizer", "sgd", "--lr", "0.1"}); }

TEST(Checkpointing, ExactResumeAfterAsynchronousSaves) {
  check_exact_resume({"--bf16"}, {"--async-save", "--save-interval", "3"});
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
  TrainResult second = run({"--train-iters", "2", "--save", dir.path(), "--seed", "7"});
  EXPECT_EQ(checkpoint::list_checkpoint_iterations(dir.path()), (std::vector<int64_t>{2}));
  EXPECT_EQ(checkpoint::read_metadata(dir / "iter_0000002").args.at("seed"), "7");
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir.path()), std::filesystem::directory_iterator()), 2)
      << "only iter_0000002 and the tracker: the replaced copy is deleted";
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
  run({"--train-iters", "2", "--save", dir.path(), "--swiglu", "--num-layers", "3"});
  FlagValues flags = parse(with(tiny_args({"--global-batch-size", "4", "--lr", "3e-3", "--log-interval", "1000",
                                           "--eval-iters", "0", "--train-iters", "4", "--hidden-size", "64"}),
                                {"--load", dir.path(), "--use-checkpoint-args"}));
  apply_checkpoint_args(flags);
  const Config c = build_config(flags, LaunchEnv{}, false);
  EXPECT_EQ(c.model.hidden_size, 32);
  EXPECT_EQ(c.model.num_layers, 3);
  EXPECT_TRUE(c.model.swiglu);
  EXPECT_EQ(train(c).iterations, 4);
  FlagValues no_load = parse(tiny_args({"--use-checkpoint-args"}));
  EXPECT_USER_ERROR(apply_checkpoint_args(no_load), "--use-checkpoint-args needs --load");
}

TEST(Checkpointing, ExitSignalSavesAndExitsCleanly) {
  TempDir dir;
  std::atomic<bool> done{false};
  // Send SIGTERM once the trainer has installed its handler.
  std::thread sender([&] {
    while (!done) {
      struct sigaction current {};
      sigaction(SIGTERM, nullptr, &current);
      if (current.sa_handler != SIG_DFL && current.sa_handler != SIG_IGN) {
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
        kill(getpid(), SIGTERM);
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  });
  TrainResult r = run({"--train-iters", "100000", "--save", dir.path(), "--exit-signal-handler"});
  done = true;
  sender.join();
  EXPECT_LT(r.iterations, 100000);
  ASSERT_TRUE(checkpoint::read_tracker(dir.path()));
  EXPECT_EQ(checkpoint::read_tracker(dir.path())->iteration, r.iterations);
  struct sigaction after {};
  sigaction(SIGTERM, nullptr, &after);
  EXPECT_EQ(after.sa_handler, SIG_DFL) << "the previous handler is restored";
}

}  // namespace
}  // namespace fp8tron
