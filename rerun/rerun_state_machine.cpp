#include "rerun/rerun_state_machine.h"

#include <cmath>
#include <limits>

#include "core/error.h"
#include "core/log.h"
#include "core/text.h"
#include "rerun/result_tracker_file.h"

namespace fp8tron::rerun {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

std::string number(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return strprintf("%.9g", v);
}

// fp8tron's way of showing a validated value in a sentence.
std::string shown(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return strprintf("%.6E", v);
}

const char* subject_name(Subject s) { return s == Subject::kLoss ? "the loss" : "the gradient norm"; }

// Megatron's names of the injected diagnoses in "Injecting error type ...".
const char* injected_title(InjectedError t) {
  switch (t) {
    case InjectedError::kCorrectResult: return "Expected result";
    case InjectedError::kTransientError: return "Transient error";
    case InjectedError::kPersistentError: return "Persistent error";
  }
  return "?";
}

std::optional<InjectedError> injected_from_name(const std::string& name) {
  for (InjectedError t : {InjectedError::kCorrectResult, InjectedError::kTransientError, InjectedError::kPersistentError})
    if (name == injected_error_name(t)) return t;
  return std::nullopt;
}

}  // namespace

RerunStateMachine::RerunStateMachine(const RerunConfig& config, std::vector<ValidationCall> calls, int rank,
                                     int world_size, Hardware hardware, uint64_t seed, bool can_checkpoint,
                                     AnyRank any_rank)
    : mode_(config.mode),
      calls_(std::move(calls)),
      rank_(rank),
      world_size_(world_size),
      hardware_(std::move(hardware)),
      can_checkpoint_(can_checkpoint),
      any_rank_(std::move(any_rank)),
      tracker_file_(config.result_rejected_tracker_filename),
      injector_(config.error_injection_rate, config.error_injection_type, seed),
      stats_(calls_.size()) {
  if (!tracker_file_.empty()) check_tracker_file_appendable(tracker_file_);
  log::info(std::string("RerunStateMachine initialized in mode ") + rerun_mode_name(mode_));
}

double RerunStateMachine::value_of(const ValidationCall& call) const {
  return call.subject == Subject::kLoss ? loss_ : grad_norm_;
}

double RerunStateMachine::threshold(const ValidationCall& call) const {
  if (call.rejection != Rejection::kUnexpectedlyLarge) return kInf;
  const auto it = large_values_.find(call.context());
  if (it == large_values_.end() || it->second.first < kLargeValueSamples) return kInf;
  return it->second.second * call.factor;
}

void RerunStateMachine::sample(const ValidationCall& call, double value) {
  if (call.rejection != Rejection::kUnexpectedlyLarge) return;
  value = std::fabs(value);
  if (!std::isfinite(value)) return;  // NaN and inf are the NaN/Inf calls' (Megatron ignores them here)
  auto& [count, largest] = large_values_[call.context()];
  if (count >= kLargeValueSamples) return;
  ++count;
  largest = std::max(largest, value);
  if (count == kLargeValueSamples) log::info(strprintf(" > Max value for %s: %s", call.context(), number(largest).c_str()));
}

bool RerunStateMachine::reporting() const { return injecting_rank_ >= 0 ? rank_ == injecting_rank_ : rank_ == 0; }

std::string RerunStateMachine::what(const ValidationCall& call, double value) const {
  std::string text = "'" + call.message + "' (" + subject_name(call.subject) + " is " + shown(value);
  if (injecting_rank_ >= 0)
    text += ", rejected by --error-injection-type " + std::string(injected_error_name(injector_.type())) + " on rank " +
            std::to_string(injecting_rank_);
  return text + ")";
}

void RerunStateMachine::log_failure(const std::string& message, bool fatal) const {
  if (!reporting()) return;
  const std::string line = strprintf("Rank %d, node %s, device %s, iteration #%lld: %s!", rank_, hardware_.node.c_str(),
                                     hardware_.device_text().c_str(), (long long)iteration_, message.c_str());
  if (fatal) log::error(line);
  else log::warning(line);
}

void RerunStateMachine::track(ValidationStatus status, double value, const ValidationCall& call) const {
  if (tracker_file_.empty() || !reporting()) return;
  append_tracker_record(tracker_file_, TrackerRecord{hardware_.node, hardware_.device_text(), rank_, iteration_, status,
                                                     value, call.message});
}

PassPlan RerunStateMachine::begin_iteration(int64_t iteration) {
  PassPlan plan;
  plan.thresholds.reserve(calls_.size());
  for (const auto& call : calls_) plan.thresholds.push_back(threshold(call));
  if (state_ == State::kWillRerunFromCheckpoint) {
    // The restarted job's first iteration is the one the checkpoint asks to re-run.
    if (iteration != iteration_)
      throw UserError(strprintf("the checkpoint asks to re-run iteration %lld, but this job starts at iteration %lld "
                                "(load the checkpoint of iteration %lld)",
                                (long long)iteration_, (long long)iteration, (long long)(iteration_ - 1)));
    state_ = State::kRerunningFromCheckpoint;
    plan.judge = true;
    plan.step_now = false;  // the verdict decides whether this pass's step is taken
    plan_ = plan;
    return plan;
  }
  iteration_ = iteration;
  injected_call_ = injecting_rank_ = -1;
  if (calls_.empty()) {
    plan_ = plan;
    return plan;
  }
  plan.judge = true;
  state_ = State::kInitialRun;
  if (mode_ == RerunMode::kReportStats) {
    plan.snapshot = true;
    plan.step_now = false;
  } else if (mode_ == RerunMode::kValidateResults) {
    if (!logged_enabled_) log::info("Result validation enabled");
    logged_enabled_ = true;
    if (first_iteration_complete_) {
      plan.snapshot = plan.device_rejection = true;
      for (size_t i = 0; i < calls_.size() && injected_call_ < 0; ++i) {
        const int rank = injector_.draw(world_size_);
        if (rank >= 0) injected_call_ = int(i), injecting_rank_ = rank;
      }
      plan.injected = injected_call_ >= 0;
    }
  }
  plan_ = plan;
  return plan;
}

PassOutcome RerunStateMachine::after_pass(double loss, double grad_norm) {
  loss_ = loss;
  grad_norm_ = grad_norm;
  PassOutcome outcome;
  switch (state_) {
    case State::kInitialRun:
      if (mode_ == RerunMode::kReportStats) outcome = report_stats_pass();
      else if (mode_ == RerunMode::kDisabled || !first_iteration_complete_) outcome = judge_first_result();
      else outcome = judge_initial_run();
      break;
    case State::kRerunningInPlace:
      outcome = mode_ == RerunMode::kReportStats ? report_stats_pass() : judge_rerun_in_place();
      break;
    case State::kRerunningFromCheckpoint: outcome = judge_rerun_from_checkpoint(); break;
    default: FP8TRON_CHECK(false, "after_pass outside of an iteration");
  }
  if (outcome.kind == PassOutcome::Kind::kAccept) {
    state_ = State::kNotRunningYet;
    first_iteration_complete_ = true;
  }
  return outcome;
}

PassOutcome RerunStateMachine::stop(int status, std::string conclusion, bool save) {
  PassOutcome o;
  o.kind = PassOutcome::Kind::kStop;
  o.exit_status = status;
  o.save_checkpoint = save;
  o.failed_call = failed_call_;
  o.failed_value = failed_call_ ? value_of(calls_[*failed_call_]) : 0.0;
  o.conclusion = std::move(conclusion);
  return o;
}

// Megatron's disabled mode: each call judges the pass's result; the first fatal rejection stops.
PassOutcome RerunStateMachine::judge_first_result() {
  for (size_t i = 0; i < calls_.size(); ++i) {
    const ValidationCall& call = calls_[i];
    const double v = value_of(call);
    const bool rejected = rejects(call, v, plan_.thresholds[i]);
    if (!rejected) {
      // Megatron validates nothing in a job's first iteration with reruns on: no sample either.
      if (mode_ == RerunMode::kDisabled) sample(call, v);
      continue;
    }
    track(ValidationStatus::kRerunDisabled, v, call);
    if (call.fatal) {
      failed_call_ = i;
      return stop(1, "");
    }
    ++warnings_;
    const auto& [count, largest] = large_values_[call.context()];
    (void)count;
    log::warning(strprintf("iteration %lld: Unexpected result %s (message='%s'): %s is at least %gx the largest of the "
                           "first %lld iterations (%s); continuing (%s)",
                           (long long)iteration_, number(v).c_str(), call.message.c_str(), subject_name(call.subject),
                           call.factor, (long long)kLargeValueSamples, number(largest).c_str(),
                           call.subject == Subject::kLoss ? "--check-for-spiky-loss" : "--check-for-large-grads"));
  }
  PassOutcome o;
  o.step = !plan_.step_now;
  return o;
}

PassOutcome RerunStateMachine::judge_initial_run() {
  std::optional<size_t> failed;
  for (size_t i = 0; i < calls_.size() && !failed; ++i) {
    const ValidationCall& call = calls_[i];
    if (int(i) == injected_call_) {
      failed = i;  // the injected rejection pre-empts the real one (no evaluation, no sample)
      break;
    }
    const double v = value_of(call);
    if (rejects(call, v, plan_.thresholds[i])) failed = i;
    else sample(call, v);
  }
  if (injected_call_ >= 0 && failed && int(*failed) != injected_call_) {
    injector_.cancel();  // a real rejection came first: Megatron would not have drawn again
    injected_call_ = injecting_rank_ = -1;
  }
  if (!failed) {
    FP8TRON_CHECK(injected_call_ < 0, "an injected rejection went unnoticed");
    return PassOutcome{};  // the step was taken
  }
  failed_call_ = failed;
  const ValidationCall& call = calls_[*failed];
  initial_result_ = value_of(call);
  if (injecting_rank_ >= 0 && rank_ == injecting_rank_)
    log::warning(std::string("Injecting error type ") + injected_title(*injector_.pending()));
  track(ValidationStatus::kInitialRun, initial_result_, call);
  if (reporting())
    log::error(strprintf("Unexpected result %s on rank %d at iteration #%lld invocation #1 (message='%s')",
                         number(initial_result_).c_str(), rank_, (long long)iteration_, call.message.c_str()));
  if (rank_ == 0) log::warning("Need to rerun step to check reproducibility of initial result");
  state_ = State::kRerunningInPlace;
  PassOutcome o;
  o.kind = PassOutcome::Kind::kRunAgain;
  return o;
}

PassOutcome RerunStateMachine::judge_rerun_in_place() {
  const ValidationCall& call = calls_[*failed_call_];
  const double v = value_of(call);
  const double difference = injector_.compare(relative_difference(initial_result_, v), /*in_place=*/true);
  const bool reproducible = difference <= call.tolerance;
  bool continuing = !call.fatal, checkpoint = false;
  if (!reproducible) {
    log_failure(strprintf("First rerun: unexpected result is not reproducible within the tolerance (%s != %s)",
                          number(v).c_str(), number(initial_result_).c_str()),
                call.fatal);
    track(ValidationStatus::kFirstRerunNotReproducible, v, call);
    log_failure("Possible transient error!", call.fatal);
  } else {
    checkpoint = call.fatal;
    suspects_.clear();
    if (injecting_rank_ < 0 || rank_ == injecting_rank_) suspects_.emplace_back(rank_, hardware_);
    track(ValidationStatus::kFirstRerunReproducible, v, call);
    log_failure(strprintf("First rerun: unexpected result is reproducible within the tolerance (%s = %s). Need to rerun "
                          "on a different GPU to verify correctness.",
                          number(v).c_str(), number(initial_result_).c_str()),
                call.fatal);
  }
  const std::vector<bool> any = any_rank_({continuing, checkpoint});
  const std::string result = what(call, initial_result_);
  if (any[0]) {
    if (rank_ == 0) log::warning("Continuing normal execution because failed validation was not fatal");
    ++warnings_;
    log::info(strprintf("iteration %lld: %s was rejected and %s when the iteration ran again in place; not fatal: "
                        "continuing with the re-run's gradients",
                        (long long)iteration_, result.c_str(), reproducible ? "reproduced" : "not reproduced"));
    PassOutcome o;
    o.step = true;
    return o;
  }
  if (!any[1]) {
    if (rank_ == 0) log::warning("Exiting now. The job can be resumed from a previous checkpoint");
    return stop(kExitFailedOnResultValidation,
                strprintf("iteration %lld: %s could not be reproduced by running the iteration again in place: a "
                          "transient fault of the hardware, not a problem of the model or the data; exiting with status "
                          "%d (Megatron's EXIT_CODE_FAILED_ON_RESULT_VALIDATION): resume the job from its last "
                          "checkpoint",
                          (long long)iteration_, result.c_str(), kExitFailedOnResultValidation));
  }
  if (!can_checkpoint_) {
    return stop(kExitFailedOnResultValidation,
                strprintf("iteration %lld: %s is reproducible when the iteration runs again on the same hardware, but "
                          "without --save no checkpoint can take it to another GPU to tell a persistent fault of this "
                          "one from a problem of the model or the data; exiting with status %d",
                          (long long)iteration_, result.c_str(), kExitFailedOnResultValidation));
  }
  state_ = State::kWillRerunFromCheckpoint;
  if (rank_ == 0)
    log::warning("Saving a checkpoint and exiting now. Please resume the job from the checkpoint to rerun the last "
                 "iteration and establish a diagnostic");
  return stop(kExitResumeToDisambiguate,
              strprintf("iteration %lld: %s is reproducible when the iteration runs again on the same hardware; saved "
                        "the checkpoint of iteration %lld and exiting with status %d (Megatron's "
                        "EXIT_CODE_RESUME_TO_DISAMBIGUATE): resume the job from it on another node or GPU to tell a "
                        "persistent fault of this hardware from a problem of the model or the data (--rerun-mode "
                        "disabled stops at such a result at once)",
                        (long long)iteration_, result.c_str(), (long long)(iteration_ - 1), kExitResumeToDisambiguate),
              /*save=*/true);
}

PassOutcome RerunStateMachine::judge_rerun_from_checkpoint() {
  const ValidationCall& call = calls_[*failed_call_];
  const double v = value_of(call);
  bool same_hardware = false;
  for (const auto& [rank, where] : suspects_) same_hardware = same_hardware || (rank == rank_ && where == hardware_);
  const double difference = injector_.compare(relative_difference(initial_result_, v), /*in_place=*/false);
  const bool reproducible = difference <= call.tolerance;
  const std::vector<bool> any = any_rank_({same_hardware, !call.fatal});
  const std::string result = what(call, initial_result_);
  if (any[0]) {
    if (same_hardware)
      log::error(strprintf("Got rescheduled on the same GPU. Need to resume again from the same checkpoint (node: %s, "
                           "gpu: %s)",
                           hardware_.node.c_str(), hardware_.device_text().c_str()));
    if (rank_ == 0) {
      log::warning("Need to restart job from the same checkpoint because it was scheduled on the same node/GPU");
      log::warning("Exiting now. Please resume the job from the same checkpoint to rerun the last iteration and "
                   "establish a diagnostic");
    }
    state_ = State::kWillRerunFromCheckpoint;
    return stop(kExitResumeToDisambiguate,
                strprintf("iteration %lld: to judge %s the job must re-run the iteration on other hardware than the "
                          "run that rejected it, but a rank runs on the same node and GPU; exiting with status %d: "
                          "resume from the same checkpoint elsewhere",
                          (long long)iteration_, result.c_str(), kExitResumeToDisambiguate));
  }
  std::string verdict;
  if (!reproducible) {
    track(ValidationStatus::kSecondRerunNotReproducible, v, call);
    if (reporting())
      log::warning(strprintf("Second rerun: unexpected result is not reproducible on a different GPU, therefore was "
                             "likely incorrect (%s != %s)",
                             number(v).c_str(), number(initial_result_).c_str()));
    log_failure("Possible persistent error!", true);
    verdict = "is not reproducible on other hardware although it was on the first: a persistent fault of the "
              "hardware that computed it";
    for (size_t i = 0; i < suspects_.size(); ++i)
      verdict += strprintf("%srank %d on node %s, device %s", i == 0 ? " (" : ", ", suspects_[i].first,
                           suspects_[i].second.node.c_str(), suspects_[i].second.device_text().c_str());
    if (!suspects_.empty()) verdict += "): have it tested";
  } else {
    track(ValidationStatus::kSecondRerunReproducible, v, call);
    if (reporting())
      log::warning(strprintf("Second rerun: unexpected result is reproducible on a different GPU, therefore it was "
                             "likely correct (%s = %s)",
                             number(v).c_str(), number(initial_result_).c_str()));
    log_failure("Correct result (but possible Application error) (" + call.message + ")", true);
    verdict = "is reproducible on other hardware as well: the result is correct for this model and data, not a fault "
              "of the hardware (resume from an earlier checkpoint with a lower --lr or other data)";
  }
  if (any[1]) {
    if (rank_ == 0) log::warning("Continuing normal execution because failed validation was not fatal");
    PassOutcome o;
    o.step = true;
    return o;
  }
  if (rank_ == 0)
    log::warning("Exiting now. A checkpoint at the last iteration already exists if further examination is needed");
  return stop(kExitFailedOnResultValidation,
              strprintf("iteration %lld: %s %s; exiting with status %d (Megatron's EXIT_CODE_FAILED_ON_RESULT_VALIDATION)",
                        (long long)iteration_, result.c_str(), verdict.c_str(), kExitFailedOnResultValidation));
}

PassOutcome RerunStateMachine::report_stats_pass() {
  PassOutcome o;
  if (state_ == State::kInitialRun) {
    initial_values_.clear();
    for (const auto& call : calls_) initial_values_.push_back(value_of(call));
    state_ = State::kRerunningInPlace;
    o.kind = PassOutcome::Kind::kRunAgain;
    return o;
  }
  for (size_t i = 0; i < calls_.size(); ++i)
    stats_[i].record(relative_difference(initial_values_[i], value_of(calls_[i])));
  // Megatron reports every REPORTING_INTERVAL_ITERATIONS (2) iterations, on rank 0. The values are
  // global, so every rank's statistics are rank 0's (Megatron gathers per-rank local ones).
  if (iteration_ % 2 == 0) {
    log::info("Stats on computation determinism in validation calls");
    for (size_t i = 0; i < calls_.size(); ++i) {
      log::info("  From validation call '" + calls_[i].message + "':");
      log::info("    " + stats_[i].summary());
    }
  }
  o.step = true;
  return o;
}

void RerunStateMachine::resume_from(const RerunRecord& r, bool same_layout) {
  if (mode_ == RerunMode::kDisabled) {
    log::warning("RerunStateMachine disabled via CLI, ignoring machine state saved in checkpoint");
    return;
  }
  if (!same_layout) {
    log::info("Job sharding has changed: Rerun state will be ignored");
    return;
  }
  std::optional<size_t> call;
  for (size_t i = 0; i < calls_.size(); ++i)
    if (calls_[i].message == r.failed_call) call = i;
  if (!call)
    throw UserError("the checkpoint asks to re-run iteration " + std::to_string(r.iteration) + " to judge its result '" +
                    r.failed_call + "', which this run does not validate: pass the --check-for-* flags of the job "
                    "that saved it, or --rerun-mode disabled to continue without judging it");
  if (mode_ == RerunMode::kReportStats)
    log::info("the checkpoint asks to re-run an iteration: --rerun-mode validate_results for this job, as Megatron "
              "takes the checkpoint's mode");
  log::warning("Getting RerunStateMachine state from checkpoint. Will rerun step.");
  mode_ = RerunMode::kValidateResults;
  state_ = State::kWillRerunFromCheckpoint;
  iteration_ = r.iteration;
  failed_call_ = call;
  initial_result_ = r.initial_result;
  const auto type = injected_from_name(r.error_injection_type);
  injector_.restore(r.error_injection_rate, type.value_or(InjectedError::kTransientError),
                    injected_from_name(r.injected_error));
  suspects_ = r.suspects;
  // The injecting rank is the one suspect of an injected error.
  injecting_rank_ = !r.injected_error.empty() && r.suspects.size() == 1 ? r.suspects.front().first : -1;
  large_values_ = r.large_values;
}

RerunRecord RerunStateMachine::record() const {
  RerunRecord r;
  r.mode = rerun_mode_name(mode_);
  r.iteration = iteration_;
  r.failed_call = failed_call_ ? calls_[*failed_call_].message : "";
  r.initial_result = initial_result_;
  r.error_injection_rate = injector_.rate();
  r.error_injection_type = injected_error_name(injector_.type());
  if (injector_.pending()) r.injected_error = injected_error_name(*injector_.pending());
  r.suspects = suspects_;
  r.large_values = large_values_;
  return r;
}

std::vector<std::pair<int, Hardware>> RerunStateMachine::own_suspect_entry() const {
  std::vector<std::pair<int, Hardware>> mine;
  for (const auto& s : suspects_)
    if (s.first == rank_) mine.push_back(s);
  return mine;
}

}  // namespace fp8tron::rerun
