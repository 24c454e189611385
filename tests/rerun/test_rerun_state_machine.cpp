// The rerun engine without a model (rerun/): Megatron's state machine driven pass by pass
// with hand-made values, its comparisons, the error injector, the report_stats statistics, the
// tracker file and its iterations to skip, the flags, and the record a checkpoint carries.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>

#include "tests/checkpoint/temp_dir.h"
#include "core/text.h"
#include "tests/test_helpers.h"
#include "checkpoint/metadata.h"
#include "rerun/determinism_stats.h"
#include "rerun/error_injector.h"
#include "rerun/rerun_state_machine.h"
#include "rerun/result_tracker_file.h"
#include "rerun/validation_calls.h"

namespace fp8tron::rerun {
namespace {

using Kind = PassOutcome::Kind;
constexpr double kNan = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

NumericsChecks all_checks() {
  NumericsChecks c;
  c.spiky_loss = c.large_grads = true;
  return c;
}

// One rank; `any_rank` answers with the flags themselves (a single rank's reduction).
RerunStateMachine machine(RerunMode mode, NumericsChecks checks = {}, int64_t rate = 0,
                          InjectedError type = InjectedError::kTransientError, const std::string& node = "node-a",
                          bool can_checkpoint = true, const std::string& tracker = "") {
  RerunConfig config;
  config.mode = mode;
  config.error_injection_rate = rate;
  config.error_injection_type = type;
  config.result_rejected_tracker_filename = tracker;
  return RerunStateMachine(config, validation_calls(checks), 0, 1, Hardware{node, 0}, 1234, can_checkpoint,
                           [](const std::vector<bool>& v) { return v; });
}

// One iteration whose every pass has these values; returns the last outcome.
PassOutcome iterate(RerunStateMachine& m, int64_t iteration, double loss, double grad_norm, int* passes = nullptr) {
  m.begin_iteration(iteration);
  PassOutcome o;
  int n = 0;
  do {
    o = m.after_pass(loss, grad_norm);
    ++n;
  } while (o.kind == Kind::kRunAgain);
  if (passes) *passes = n;
  return o;
}

TEST(RerunValidationCalls, FollowMegatronsOrderFatalityAndTolerances) {
  const auto calls = validation_calls(all_checks());
  ASSERT_EQ(calls.size(), 6u);
  EXPECT_EQ(calls[0].message, "found NaN in forward loss calculation");
  EXPECT_EQ(calls[2].message, "Spiky loss");
  EXPECT_FALSE(calls[2].fatal);
  EXPECT_EQ(calls[3].subject, Subject::kGradNorm);
  EXPECT_EQ(calls[5].message, "found unexpected large grads");
  EXPECT_EQ(calls[0].tolerance, 0.0);
  EXPECT_EQ(calls[3].tolerance, 0.001);
  NumericsChecks none;
  none.nan_in_loss_and_grad = false;
  EXPECT_TRUE(validation_calls(none).empty());
}

TEST(RerunValidationCalls, RelativeDifferenceIsMegatronsComparison) {
  EXPECT_EQ(relative_difference(2.0, 2.0), 0.0);
  EXPECT_EQ(relative_difference(kNan, kNan), 0.0);
  EXPECT_EQ(relative_difference(kInf, kInf), 0.0);
  EXPECT_EQ(relative_difference(kNan, 1.0), kInf);
  EXPECT_EQ(relative_difference(kInf, 1.0), kInf);
  EXPECT_EQ(relative_difference(kNan, kInf), kInf);
  EXPECT_DOUBLE_EQ(relative_difference(1.0, 3.0), 1.0);  // |1 - 3| / 2
  EXPECT_EQ(relative_difference(1.0, -1.0), kInf);
}

TEST(RerunStateMachine, DisabledStopsAtTheFirstFatalResultAndWarnsOfSpikes) {
  auto m = machine(RerunMode::kDisabled, all_checks());
  // The first 100 values set the largest (2 and 3); later ones at least 10x it are reported.
  for (int i = 1; i <= 100; ++i) {
    const PassPlan plan = m.begin_iteration(i);
    EXPECT_TRUE(plan.judge && plan.step_now && !plan.snapshot && !plan.device_rejection);
    EXPECT_EQ(m.after_pass(i == 50 ? 2.0 : 1.0, i == 60 ? 3.0 : 1.0).kind, Kind::kAccept);
  }
  EXPECT_EQ(iterate(m, 101, 19.9, 29.9).kind, Kind::kAccept);
  EXPECT_EQ(m.warnings(), 0);
  const PassPlan plan = m.begin_iteration(102);
  EXPECT_EQ(plan.thresholds[2], 20.0);
  EXPECT_EQ(plan.thresholds[5], 30.0);
  EXPECT_EQ(m.after_pass(20.0, 30.0).kind, Kind::kAccept) << "spikes are reported, not fatal";
  EXPECT_EQ(m.warnings(), 2);
  const PassOutcome o = iterate(m, 103, 1.0, kInf);
  EXPECT_EQ(o.kind, Kind::kStop);
  EXPECT_EQ(o.exit_status, 1);
  EXPECT_EQ(*o.failed_call, 4u);  // "found Inf in grad norm"
}

TEST(RerunStateMachine, ValidateJudgesAJobsFirstIterationWithoutARerun) {
  auto m = machine(RerunMode::kValidateResults);
  const PassPlan plan = m.begin_iteration(1);
  EXPECT_FALSE(plan.snapshot);
  EXPECT_FALSE(plan.device_rejection);
  const PassOutcome o = m.after_pass(kNan, kNan);
  EXPECT_EQ(o.kind, Kind::kStop);
  EXPECT_EQ(o.exit_status, 1);
}

TEST(RerunStateMachine, AReproducibleFatalResultAsksForACheckpointAndExit16) {
  auto m = machine(RerunMode::kValidateResults);
  EXPECT_EQ(iterate(m, 1, 3.0, 1.0).kind, Kind::kAccept);
  const PassPlan plan = m.begin_iteration(2);
  EXPECT_TRUE(plan.snapshot && plan.device_rejection && plan.step_now);
  PassOutcome o = m.after_pass(kNan, kNan);
  EXPECT_EQ(o.kind, Kind::kRunAgain);
  o = m.after_pass(kNan, kNan);
  ASSERT_EQ(o.kind, Kind::kStop);
  EXPECT_EQ(o.exit_status, kExitResumeToDisambiguate);
  EXPECT_TRUE(o.save_checkpoint);
  EXPECT_NE(o.conclusion.find("is reproducible when the iteration runs again on the same hardware; saved the "
                              "checkpoint of iteration 1"),
            std::string::npos)
      << o.conclusion;
  const RerunRecord r = m.record();
  EXPECT_EQ(r.iteration, 2);
  EXPECT_EQ(r.failed_call, "found NaN in forward loss calculation");
  EXPECT_TRUE(std::isnan(r.initial_result));
  ASSERT_EQ(r.suspects.size(), 1u);
  EXPECT_EQ(r.suspects[0].second, (Hardware{"node-a", 0}));
}

TEST(RerunStateMachine, WithoutSaveAReproducibleResultEndsWith17) {
  auto m = machine(RerunMode::kValidateResults, {}, 0, InjectedError::kTransientError, "node-a", /*can_checkpoint=*/false);
  iterate(m, 1, 3.0, 1.0);
  const PassOutcome o = iterate(m, 2, kInf, kNan);
  EXPECT_EQ(o.exit_status, kExitFailedOnResultValidation);
  EXPECT_FALSE(o.save_checkpoint);
  EXPECT_NE(o.conclusion.find("without --save"), std::string::npos);
}

TEST(RerunStateMachine, TheRestartedJobJudgesTheRerunOnOtherHardware) {
  auto first = machine(RerunMode::kValidateResults);
  iterate(first, 1, 3.0, 1.0);
  iterate(first, 2, kNan, kNan);
  const RerunRecord record = first.record();
  // Restarted on the same node and GPU: exit 16 again, without a new checkpoint.
  auto same = machine(RerunMode::kValidateResults);
  same.resume_from(record, true);
  PassPlan plan = same.begin_iteration(2);
  EXPECT_FALSE(plan.step_now);
  PassOutcome o = same.after_pass(kNan, kNan);
  EXPECT_EQ(o.exit_status, kExitResumeToDisambiguate);
  EXPECT_FALSE(o.save_checkpoint);
  // Elsewhere and reproducible: a correct result (of the model and data), exit 17.
  auto other = machine(RerunMode::kValidateResults, {}, 0, InjectedError::kTransientError, "node-b");
  other.resume_from(record, true);
  other.begin_iteration(2);
  o = other.after_pass(kNan, kNan);
  EXPECT_EQ(o.exit_status, kExitFailedOnResultValidation);
  EXPECT_NE(o.conclusion.find("is reproducible on other hardware as well"), std::string::npos) << o.conclusion;
  // Elsewhere and different: a persistent fault of the first GPU.
  auto differs = machine(RerunMode::kValidateResults, {}, 0, InjectedError::kTransientError, "node-b");
  differs.resume_from(record, true);
  differs.begin_iteration(2);
  o = differs.after_pass(2.5, 1.0);
  EXPECT_EQ(o.exit_status, kExitFailedOnResultValidation);
  EXPECT_NE(o.conclusion.find("a persistent fault of the hardware that computed it (rank 0 on node node-a, device 0)"),
            std::string::npos)
      << o.conclusion;
  // The checkpoint must be loaded at the iteration before: starting elsewhere is refused.
  auto wrong = machine(RerunMode::kValidateResults, {}, 0, InjectedError::kTransientError, "node-b");
  wrong.resume_from(record, true);
  EXPECT_USER_ERROR(wrong.begin_iteration(5), "asks to re-run iteration 2");
  // Disabled, or another layout: the record is ignored and training goes on.
  auto disabled = machine(RerunMode::kDisabled);
  disabled.resume_from(record, true);
  EXPECT_EQ(iterate(disabled, 2, 3.0, 1.0).kind, Kind::kAccept);
  auto resharded = machine(RerunMode::kValidateResults);
  resharded.resume_from(record, false);
  EXPECT_EQ(iterate(resharded, 2, 3.0, 1.0).kind, Kind::kAccept);
  // A run that does not validate the rejected call cannot judge it.
  NumericsChecks spiky_only;
  spiky_only.nan_in_loss_and_grad = false;
  spiky_only.spiky_loss = true;
  auto unable = machine(RerunMode::kValidateResults, spiky_only);
  EXPECT_USER_ERROR(unable.resume_from(record, true), "which this run does not validate");
}

TEST(RerunStateMachine, InjectedErrorsLeadToMegatronsDiagnoses) {
  // Rate 1: the first call of every validated iteration is rejected on rank 0.
  {
    auto m = machine(RerunMode::kValidateResults, {}, 1, InjectedError::kTransientError);
    EXPECT_FALSE(m.begin_iteration(1).injected) << "the first iteration is not validated";
    m.after_pass(3.0, 1.0);
    EXPECT_TRUE(m.begin_iteration(2).injected);
    EXPECT_EQ(m.after_pass(3.0, 1.0).kind, Kind::kRunAgain);
    const PassOutcome o = m.after_pass(3.0, 1.0);
    EXPECT_EQ(o.exit_status, kExitFailedOnResultValidation);
    EXPECT_NE(o.conclusion.find("could not be reproduced"), std::string::npos) << o.conclusion;
    EXPECT_NE(o.conclusion.find("rejected by --error-injection-type transient_error on rank 0)"), std::string::npos);
  }
  for (InjectedError type : {InjectedError::kPersistentError, InjectedError::kCorrectResult}) {
    auto m = machine(RerunMode::kValidateResults, {}, 1, type);
    iterate(m, 1, 3.0, 1.0);
    const PassOutcome first = iterate(m, 2, 3.0, 1.0);
    EXPECT_EQ(first.exit_status, kExitResumeToDisambiguate);
    const RerunRecord record = m.record();
    EXPECT_EQ(record.injected_error, injected_error_name(type));
    auto restarted = machine(RerunMode::kValidateResults, {}, 1, type, "node-b");
    restarted.resume_from(record, true);
    restarted.begin_iteration(2);
    const PassOutcome second = restarted.after_pass(3.0, 1.0);
    EXPECT_EQ(second.exit_status, kExitFailedOnResultValidation);
    const char* want = type == InjectedError::kPersistentError ? "persistent fault" : "correct for this model and data";
    EXPECT_NE(second.conclusion.find(want), std::string::npos) << second.conclusion;
  }
}

TEST(RerunStateMachine, NonFatalRejectionsContinueWithTheRerunsStep) {
  NumericsChecks spiky;
  spiky.nan_in_loss_and_grad = false;
  spiky.spiky_loss = true;
  for (InjectedError type : {InjectedError::kTransientError, InjectedError::kCorrectResult}) {
    auto m = machine(RerunMode::kValidateResults, spiky, 1, type);
    iterate(m, 1, 3.0, 1.0);
    int passes = 0;
    const PassOutcome o = iterate(m, 2, 3.0, 1.0, &passes);
    EXPECT_EQ(passes, 2);
    EXPECT_EQ(o.kind, Kind::kAccept);
    EXPECT_TRUE(o.step) << "the re-run's gradients are applied";
    EXPECT_EQ(m.warnings(), 1);
  }
  // A real spike after 100 samples: re-run, reproducible, continue.
  auto m = machine(RerunMode::kValidateResults, spiky);
  for (int i = 1; i <= 101; ++i) EXPECT_EQ(iterate(m, i, 1.0, 1.0).kind, Kind::kAccept);
  const PassPlan plan = m.begin_iteration(102);
  EXPECT_EQ(plan.thresholds[0], 10.0);
  EXPECT_EQ(m.after_pass(10.0, 1.0).kind, Kind::kRunAgain);
  const PassOutcome o = m.after_pass(10.0, 1.0);
  EXPECT_EQ(o.kind, Kind::kAccept);
  EXPECT_TRUE(o.step);
}

TEST(RerunStateMachine, AnEarlierRealRejectionPreEmptsTheInjectedOne) {
  // At rate 4 the injection lands on any of the six calls; where it lands after a real NaN loss,
  // the NaN is the failed call (and found reproducible), and nothing counts as injected.
  int pre_empted = 0;
  for (uint64_t seed = 1; seed <= 40; ++seed) {
    RerunConfig config;
    config.error_injection_rate = 4;
    config.error_injection_type = InjectedError::kPersistentError;
    RerunStateMachine m(config, validation_calls(all_checks()), 0, 1, Hardware{"n", 0}, seed, true,
                        [](const std::vector<bool>& v) { return v; });
    iterate(m, 1, 3.0, 1.0);
    for (int64_t i = 2; i < 100; ++i) {
      if (!m.begin_iteration(i).injected) {
        EXPECT_EQ(m.after_pass(3.0, 1.0).kind, Kind::kAccept);
        continue;
      }
      EXPECT_EQ(m.after_pass(kNan, kNan).kind, Kind::kRunAgain);
      EXPECT_EQ(m.after_pass(kNan, kNan).exit_status, kExitResumeToDisambiguate);
      EXPECT_EQ(m.record().failed_call, "found NaN in forward loss calculation");
      pre_empted += m.record().injected_error.empty();
      break;
    }
  }
  EXPECT_GT(pre_empted, 5);
}

TEST(RerunStateMachine, ReportStatsRerunsEveryIterationAndJudgesNothing) {
  auto m = machine(RerunMode::kReportStats);
  for (int i = 1; i <= 4; ++i) {
    const PassPlan plan = m.begin_iteration(i);
    EXPECT_TRUE(plan.snapshot);
    EXPECT_FALSE(plan.step_now);
    EXPECT_EQ(m.after_pass(kNan, 1.0).kind, Kind::kRunAgain);
    const PassOutcome o = m.after_pass(kNan, i == 3 ? 1.01 : 1.0);
    EXPECT_EQ(o.kind, Kind::kAccept) << "a NaN is not judged";
    EXPECT_TRUE(o.step);
  }
}

TEST(DeterminismStats, SummarisesLikeMegatronsQuickStats) {
  DeterminismStats s;
  for (int i = 0; i < 3; ++i) s.record(0.0);
  EXPECT_EQ(s.summary(), "3 samples, all identical");
  s.record(1e-3);
  s.record(2e-3);
  EXPECT_EQ(s.total(), 5);
  EXPECT_EQ(s.summary(),
            "5/3 total/identical samples, rel. variability: avg= 6.000E-04, p50= 0.0, p90= 2.000E-03, p99= 2.000E-03, "
            "p99.9= 2.000E-03, max: 2.000E-03");
  DeterminismStats many;
  for (int i = 0; i < 1234; ++i) many.record(0.0);
  EXPECT_EQ(many.summary(), "1,234 samples, all identical");
}

TEST(ErrorInjector, OneRankInjectsAndAPendingDiagnosisBlocksFurtherDraws) {
  ErrorInjector never(0, InjectedError::kTransientError, 1);
  EXPECT_EQ(never.draw(8), -1);
  ErrorInjector always(1, InjectedError::kPersistentError, 1);
  EXPECT_EQ(always.draw(8), 0);
  EXPECT_EQ(always.draw(8), -1) << "one injected error at a time";
  EXPECT_EQ(always.compare(0.5, true), 0.0) << "a persistent error reproduces in place";
  EXPECT_EQ(always.compare(0.0, false), kInf) << "... and not elsewhere";
  EXPECT_FALSE(always.pending());
  // Over many draws at rate 4 with 2 ranks, ranks 0 and 1 both inject, ranks >= 2 never exist.
  ErrorInjector some(4, InjectedError::kTransientError, 7);
  int hits[2] = {0, 0}, misses = 0;
  for (int i = 0; i < 400; ++i) {
    const int r = some.draw(2);
    if (r < 0) ++misses;
    else ++hits[r], some.cancel();
  }
  EXPECT_GT(hits[0], 50);
  EXPECT_GT(hits[1], 50);
  EXPECT_GT(misses, 100);
}

TEST(ResultTrackerFile, RecordsAndTheIterationsToSkip) {
  checkpoint::testing::TempDir dir;
  const std::string path = dir / "tracker.txt";
  check_tracker_file_appendable(path);
  auto add = [&](int rank, int64_t it, ValidationStatus status) {
    append_tracker_record(path, TrackerRecord{"node-a", "0", rank, it, status, kNan, "found NaN in grad norm"});
  };
  add(0, 5, ValidationStatus::kInitialRun);
  add(0, 5, ValidationStatus::kFirstRerunReproducible);
  add(0, 7, ValidationStatus::kRerunDisabled);
  add(0, 5, ValidationStatus::kSecondRerunReproducible);  // twice on rank 0: skip 5
  add(0, 9, ValidationStatus::kFirstRerunNotReproducible);
  add(0, 9, ValidationStatus::kFirstRerunNotReproducible);  // transient: never skipped
  std::string first_line;
  std::getline(std::ifstream(path), first_line);
  EXPECT_NE(first_line.find(" node=node-a device=0 jobID="), std::string::npos) << first_line;
  EXPECT_NE(first_line.find(" rank=0 iteration=5 status=initial_run result=nan message='found NaN in grad norm'"),
            std::string::npos)
      << first_line;
  EXPECT_EQ(iterations_to_skip_from_tracker(path), (std::vector<int64_t>{5}));
  // Megatron's qualified status names count too, and a rank seen twice in different jobs.
  auto line = [](int job, int rank, int64_t it, const char* status) {
    return strprintf("ts=x node=n device=0 jobID=%d rank=%d iteration=%lld status=%s result=1 message='m'\n", job, rank,
                     (long long)it, status);
  };
  std::ofstream(path, std::ios::app) << line(42, 3, 11, "RerunValidationStatus.RERUN_DISABLED")
                                     << line(43, 3, 11, "RerunValidationStatus.RERUN_DISABLED")
                                     << line(45, 2, 13, "rerun_disabled") << line(45, 2, 13, "rerun_disabled");
  std::vector<int64_t> ignored;
  EXPECT_EQ(iterations_to_skip_from_tracker(path, &ignored), (std::vector<int64_t>{5, 11, 13}));
  EXPECT_TRUE(ignored.empty());
  // Two ranks of one job reporting an iteration make it a problem of the job, not of a GPU.
  std::ofstream(path, std::ios::app) << line(46, 6, 13, "rerun_disabled") << line(46, 7, 13, "rerun_disabled");
  EXPECT_EQ(iterations_to_skip_from_tracker(path, &ignored), (std::vector<int64_t>{5, 11}));
  EXPECT_EQ(ignored, (std::vector<int64_t>{13}));
  EXPECT_TRUE(iterations_to_skip_from_tracker(dir / "missing.txt").empty());
  EXPECT_USER_ERROR(check_tracker_file_appendable(dir / "no_such_dir/t.txt"),
                    "--result-rejected-tracker-filename");
}

TEST(RerunFlags, MegatronsFlagsAndTheirBadValues) {
  using fp8tron::testing::build;
  using fp8tron::testing::tiny_args;
  EXPECT_EQ(build(tiny_args()).training.rerun.mode, RerunMode::kValidateResults) << "Megatron's default";
  EXPECT_EQ(build(tiny_args({"--rerun-mode", "disabled"})).training.rerun.mode, RerunMode::kDisabled);
  EXPECT_EQ(build(tiny_args({"--rerun-mode", "report_stats"})).training.rerun.mode, RerunMode::kReportStats);
  EXPECT_USER_ERROR(build(tiny_args({"--rerun-mode", "validate"})), "--rerun-mode: invalid choice 'validate'");
  const Config c = build(tiny_args({"--error-injection-rate", "100", "--error-injection-type", "persistent_error"}));
  EXPECT_EQ(c.training.rerun.error_injection_rate, 100);
  EXPECT_EQ(c.training.rerun.error_injection_type, InjectedError::kPersistentError);
  EXPECT_USER_ERROR(build(tiny_args({"--error-injection-rate", "-1"})), "--error-injection-rate -1: must be 0");
  EXPECT_USER_ERROR(build(tiny_args({"--error-injection-type", "flaky"})), "--error-injection-type: invalid choice");
  auto warned = [](const Config& cfg, const std::string& text) {
    for (const auto& w : cfg.hint_warnings)
      if (w.find(text) != std::string::npos) return true;
    return false;
  };
  EXPECT_TRUE(warned(build(tiny_args({"--rerun-mode", "disabled", "--error-injection-rate", "5"})),
                     "--error-injection-rate has no effect with --rerun-mode disabled"));
  EXPECT_TRUE(warned(build(tiny_args({"--error-injection-type", "correct_result"})),
                     "--error-injection-type has no effect without --error-injection-rate"));
  EXPECT_EQ(build(tiny_args({"--iterations-to-skip", "7", "3", "7"})).training.iterations_to_skip,
            (std::vector<int64_t>{3, 7}));
  EXPECT_USER_ERROR(build(tiny_args({"--iterations-to-skip", "0"})), "iterations are numbered from 1");
  // The tracker file's skipped iterations are added.
  checkpoint::testing::TempDir dir;
  const std::string path = dir / "t.txt";
  for (int k = 0; k < 2; ++k)
    append_tracker_record(path, TrackerRecord{"n", "0", 0, 4, ValidationStatus::kRerunDisabled, kNan, "m"});
  const Config t = build(tiny_args({"--result-rejected-tracker-filename", path, "--iterations-to-skip", "9"}));
  EXPECT_EQ(t.training.iterations_to_skip, (std::vector<int64_t>{4, 9}));
  EXPECT_EQ(t.training.rerun.result_rejected_tracker_filename, path);
}

TEST(RerunRecord, RoundTripsThroughTheCheckpointMetadataWithNanAndInf) {
  checkpoint::CheckpointMetadata m;
  m.parallel.world_size = 1;
  m.skipped_train_samples = 24;
  RerunRecord r;
  r.iteration = 7;
  r.failed_call = "found Inf in grad norm";
  r.initial_result = -kInf;
  r.error_injection_rate = 3;
  r.error_injection_type = "persistent_error";
  r.injected_error = "persistent_error";
  r.suspects = {{0, Hardware{"node-a", -1}}, {1, Hardware{"node b", 3}}};
  r.large_values = {{"loss", {100, 2.5}}, {"grads", {37, kInf}}};
  m.rerun = r;
  const auto parsed = checkpoint::parse_metadata(checkpoint::serialize_metadata(m), "test");
  EXPECT_EQ(parsed, m);
  r.initial_result = kNan;
  m.rerun = r;
  const auto with_nan = checkpoint::parse_metadata(checkpoint::serialize_metadata(m), "test");
  EXPECT_TRUE(std::isnan(with_nan.rerun->initial_result));
  checkpoint::CheckpointMetadata plain;
  plain.parallel.world_size = 1;
  EXPECT_FALSE(checkpoint::parse_metadata(checkpoint::serialize_metadata(plain), "test").rerun.has_value());
}

}  // namespace
}  // namespace fp8tron::rerun
