// The rerun engine through the trainer (one process, CPU, fp32): --rerun-mode validate_results
// re-runs a rejected iteration in place from the same state and attributes the result (Megatron's
// exit 16 with a checkpoint of the state before it, the restarted job's verdict, exit 17);
// report_stats re-runs every iteration; --iterations-to-skip and the tracker file.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "tests/checkpoint/temp_dir.h"
#include "tests/test_helpers.h"
#include "checkpoint/checkpoint_dir.h"
#include "checkpoint/metadata.h"
#include "rerun/result_tracker_file.h"
#include "trainer/trainer.h"

namespace fp8tron {
namespace {
using namespace fp8tron::testing;
using checkpoint::testing::TempDir;

TrainResult run(const std::vector<std::string>& args) {
  const Config c = build(with(tiny_args({"--global-batch-size", "4", "--lr", "3e-3", "--log-interval", "1000",
                                         "--eval-iters", "0", "--weight-decay", "0.1"}),
                              args));
  return train(c, TrainOptions{.collect_final_weights = true});
}

void expect_identical(const TrainResult& a, const TrainResult& b) {
  EXPECT_EQ(a.losses, b.losses);
  ASSERT_EQ(a.final_weights.size(), b.final_weights.size());
  for (const auto& [name, w] : a.final_weights) EXPECT_TRUE(torch::equal(w, b.final_weights.at(name))) << name;
}

// Runs `statement`, which must end the run with RunEnd(exit_status) whose message contains `needle`.
#define EXPECT_RUN_END(statement, exit_status, needle)                                             \
  do {                                                                                             \
    try {                                                                                          \
      statement;                                                                                   \
      ADD_FAILURE() << "expected the run to end with status " << (exit_status);                    \
    } catch (const ::fp8tron::RunEnd& e) {                                                         \
      EXPECT_EQ(e.status(), (exit_status)) << e.what();                                            \
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << "message: " << e.what(); \
    }                                                                                              \
  } while (0)

const std::vector<std::string> kDropout = {"--hidden-dropout", "0.1", "--attention-dropout", "0.1"};
// Only the non-fatal checks, and every validated iteration's first one rejected by an injected
// transient error: from the second iteration on, each runs twice and the re-run's step is applied.
const std::vector<std::string> kRerunEveryIteration = {"--no-check-for-nan-in-loss-and-grad", "--check-for-spiky-loss",
                                                       "--check-for-large-grads", "--error-injection-rate", "1",
                                                       "--error-injection-type", "transient_error"};

// A re-run in place must reproduce the first run bit for bit, or the run would drift from the one
// without re-runs: the dropout masks (RNG), the FP8 amax histories and scales, the MoE expert
// biases and the micro-batches are restored, the gradients zeroed again, no step taken twice.
TEST(RerunInPlace, ReproducesTheIterationBitForBit) {
  const std::vector<std::vector<std::string>> variants = {
      kDropout,
      with(kDropout, {"--fp8-format", "hybrid", "--fp8-recipe", "delayed", "--fp8-amax-history-len", "4",
                      "--fp8-amax-compute-algo", "max"}),
      {"--num-experts", "4", "--moe-ffn-hidden-size", "32", "--moe-layer-freq", "([0]+[1])", "--moe-router-topk", "2",
       "--moe-router-score-function", "sigmoid", "--moe-router-enable-expert-bias", "--moe-aux-loss-coeff", "1e-2"},
  };
  for (const auto& variant : variants) {
    const auto base = with(variant, {"--train-iters", "6"});
    const TrainResult plain = run(with(base, {"--rerun-mode", "disabled"}));
    const TrainResult rerun = run(with(base, kRerunEveryIteration));
    expect_identical(plain, rerun);
  }
}

TEST(RerunInPlace, ReportStatsRunsEveryIterationTwiceAndChangesNothing) {
  const auto base = with(kDropout, {"--train-iters", "4"});
  expect_identical(run(with(base, {"--rerun-mode", "disabled"})), run(with(base, {"--rerun-mode", "report_stats"})));
}

TEST(RerunValidation, AReproducibleNanSavesTheStateBeforeAndIsJudgedOnOtherHardware) {
  TempDir dir;
  const std::string tracker = dir / "rejected.txt";
  const std::vector<std::string> plain = {"--train-iters", "8", "--save-interval", "2", "--save", dir.path()};
  const auto base = with(plain, {"--result-rejected-tracker-filename", tracker});
  const TrainResult straight = run({"--train-iters", "8"});
  // Iteration 5's NaN loss is reproduced in place: the state before it is saved as the checkpoint of
  // iteration 4, with the request to re-run iteration 5 elsewhere.
  EXPECT_RUN_END(run(with(base, {"--fp8tron-test-inject-nan", "5"})), 16,
                 "iteration 5: 'found NaN in forward loss calculation' (the loss is NaN) is reproducible when the "
                 "iteration runs again on the same hardware; saved the checkpoint of iteration 4");
  EXPECT_EQ(checkpoint::read_tracker(dir.path())->iteration, 4);
  const auto meta = checkpoint::read_metadata(dir / "iter_0000004");
  ASSERT_TRUE(meta.rerun.has_value());
  EXPECT_EQ(meta.rerun->iteration, 5);
  EXPECT_EQ(meta.rerun->failed_call, "found NaN in forward loss calculation");
  // Restarted on the same node: exit 16 again, nothing saved.
  EXPECT_RUN_END(run(with(base, {"--load", dir.path(), "--fp8tron-test-inject-nan", "5"})), 16,
                 "a rank runs on the same node and GPU");
  EXPECT_EQ(checkpoint::list_checkpoint_iterations(dir.path()), (std::vector<int64_t>{2, 4}));
  // Elsewhere, the NaN again: the result is correct for the model and data; exit 17.
  EXPECT_RUN_END(run(with(base, {"--load", dir.path(), "--fp8tron-test-inject-nan", "5", "--fp8tron-test-node-name",
                                 "elsewhere"})),
                 17, "is reproducible on other hardware as well");
  // The saved state is exactly the one before iteration 5: without the NaN the run resumes from it
  // (--rerun-mode disabled ignores the request) and ends as the uninterrupted run.
  expect_identical(straight, [&] {
    TrainResult r = run(with(plain, {"--load", dir.path(), "--rerun-mode", "disabled"}));
    r.losses.insert(r.losses.begin(), straight.losses.begin(), straight.losses.begin() + 4);
    return r;
  }());
  // The tracker file recorded iteration 5 as reproducible twice on rank 0: a later job skips it.
  EXPECT_EQ(rerun::iterations_to_skip_from_tracker(tracker), (std::vector<int64_t>{5}));
  const TrainResult skipping = run({"--train-iters", "8", "--fp8tron-test-inject-nan", "5",
                                    "--result-rejected-tracker-filename", tracker});
  EXPECT_EQ(skipping.losses.size(), 7u);
  EXPECT_EQ(skipping.consumed_samples, straight.consumed_samples);
}

TEST(RerunValidation, InjectedErrorsEndAsMegatronDiagnosesThem) {
  const TrainResult straight = run({"--train-iters", "6"});
  // Persistent: reproducible in place (exit 16 with the checkpoint of iteration 1), different on
  // other hardware (exit 17).
  {
    TempDir dir;
    const std::vector<std::string> base = {"--train-iters", "6", "--save", dir.path(), "--save-interval", "4",
                                           "--error-injection-rate", "1", "--error-injection-type", "persistent_error"};
    EXPECT_RUN_END(run(base), 16, "saved the checkpoint of iteration 1");
    EXPECT_RUN_END(run(with(base, {"--load", dir.path(), "--fp8tron-test-node-name", "elsewhere"})), 17,
                   "a persistent fault of the hardware that computed it");
  }
  // Correct result: reproducible in place and elsewhere.
  {
    TempDir dir;
    const std::vector<std::string> base = {"--train-iters", "6", "--save", dir.path(), "--error-injection-rate", "1",
                                           "--error-injection-type", "correct_result"};
    EXPECT_RUN_END(run(base), 16, "saved the checkpoint of iteration 1");
    EXPECT_RUN_END(run(with(base, {"--load", dir.path(), "--fp8tron-test-node-name", "elsewhere"})), 17,
                   "correct for this model and data");
  }
  // Transient: not reproducible in place: exit 17 without a checkpoint; the job resumes from its
  // last one and ends as the uninterrupted run.
  {
    TempDir dir;
    const std::vector<std::string> base = {"--train-iters", "6", "--save", dir.path(), "--save-interval", "1"};
    EXPECT_RUN_END(run(with(base, {"--error-injection-rate", "1"})), 17,
                   "could not be reproduced by running the iteration again in place: a transient fault");
    EXPECT_EQ(checkpoint::list_checkpoint_iterations(dir.path()), (std::vector<int64_t>{1}));
    const TrainResult resumed = run(with(base, {"--load", dir.path()}));
    ASSERT_EQ(resumed.final_weights.size(), straight.final_weights.size());
    for (const auto& [name, w] : straight.final_weights) EXPECT_TRUE(torch::equal(w, resumed.final_weights.at(name))) << name;
  }
}

TEST(RerunValidation, TheFirstIterationOfAJobIsJudgedWithoutARerun) {
  EXPECT_USER_ERROR(run({"--train-iters", "4", "--fp8tron-test-inject-nan", "1"}),
                    "iteration 1: the loss is NaN and the gradient norm NaN");
}

TEST(IterationsToSkip, ConsumeTheirSamplesWithoutAStep) {
  TempDir dir;
  const TrainResult straight = run({"--train-iters", "6"});
  const TrainResult skipped = run({"--train-iters", "6", "--iterations-to-skip", "3", "--save", dir.path()});
  EXPECT_EQ(skipped.losses.size(), 5u);
  EXPECT_EQ(skipped.consumed_samples, straight.consumed_samples);
  EXPECT_EQ(skipped.losses[0], straight.losses[0]);
  EXPECT_EQ(skipped.losses[1], straight.losses[1]);
  EXPECT_NE(skipped.losses[2], straight.losses[3]) << "iteration 4 starts from the weights after iteration 2";
  const auto meta = checkpoint::read_metadata(dir / "iter_0000006");
  EXPECT_EQ(meta.skipped_train_samples, 4);
  EXPECT_EQ(meta.consumed_train_samples, 24);
  EXPECT_EQ(meta.lr_scheduler_num_steps, 20) << "Megatron's schedule does not advance over a skipped iteration";
}

}  // namespace
}  // namespace fp8tron
