// Megatron's rerun state machine (megatron/core/rerun_state_machine.py), driven by the trainer one
// pass of an iteration at a time: begin_iteration() plans the first pass, after_pass() judges the
// pass's loss and gradient norm and says whether to accept it, run the iteration again from the
// same state, or stop. The trainer captures and restores the state (RNG streams, FP8 scaling
// state, MoE expert biases) and re-runs the same micro-batches; this class decides.
//
// --rerun-mode disabled: each validation call (validation_calls.h) judges the first result; a
//   fatal rejection (NaN/inf) stops the run, a non-fatal one (spiky loss, large grads) is reported.
// --rerun-mode validate_results (Megatron's default): from the second iteration of a job on, a
//   rejected result makes the iteration run again in place from the same state, and the two results
//   are compared (tolerance 0 for the loss, 0.1% for the gradient norm):
//     not reproducible: a transient fault. Fatal check: exit 17 (resume from the last checkpoint);
//       non-fatal: continue with the re-run's gradients.
//     reproducible: fatal check: the state before the iteration is saved as a checkpoint (of the
//       previous iteration, carrying this machine's record) and the job exits 16, to be restarted on
//       other hardware; non-fatal: continue.
//   The restarted job re-runs the iteration once from the checkpoint: on the same node and GPU it
//   exits 16 again; a different result means a persistent fault of the first GPU, the same result
//   a correct one (a problem of the math or the data); both exit 17.
//   The first iteration of a job is judged as with disabled (Megatron does not validate it, as no
//   checkpoint can be taken before a step; fp8tron still stops at a NaN there).
// --rerun-mode report_stats: every iteration runs twice and the relative differences of each
//   validation call are reported every 2 iterations; nothing is judged (a NaN is skipped, as with
//   --no-check-for-nan-in-loss-and-grad).
// Every rank decides alike: the values are global, injection draws from a shared stream, and the
// verdicts after a re-run are reduced over all ranks (Megatron's _reduce_any).
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "core/config/rerun_config.h"
#include "rerun/determinism_stats.h"
#include "rerun/error_injector.h"
#include "rerun/rerun_record.h"
#include "rerun/result_tracker_file.h"
#include "rerun/validation_calls.h"

namespace fp8tron::rerun {

// How the trainer runs the first pass of an iteration.
struct PassPlan {
  bool judge = false;      // read the pass's loss and gradient norm on the host and call after_pass
  bool snapshot = false;   // capture the state a re-run in place restores
  bool step_now = true;    // take the optimizer step right after the pass, before the verdict
  // step_now: skip that step on the device when a call rejects (or `injected`): a rejection re-runs
  // the iteration from the state before the step. Evaluates exactly after_pass's rule.
  bool device_rejection = false;
  bool injected = false;            // a call of this pass is rejected by injection
  std::vector<double> thresholds;   // per call: kUnexpectedlyLarge's threshold (inf while sampling)
};

struct PassOutcome {
  enum class Kind {
    kAccept,    // the iteration is done (step: the optimizer step with this pass's gradients is still due)
    kRunAgain,  // restore the state captured before the first pass and run the iteration again
    kStop,      // end the run: exit_status, after saving the checkpoint of iteration - 1 if asked
  };
  Kind kind = Kind::kAccept;
  bool step = false;
  int exit_status = 0;           // 1: a fatal result judged without re-run (the trainer's message)
  bool save_checkpoint = false;  // with record(): the state before the iteration, for the restarted job
  std::optional<size_t> failed_call;  // the rejecting call (index into calls())
  double failed_value = 0;
  std::string conclusion;        // one line: what was concluded and what to do
};

class RerunStateMachine {
 public:
  // Over all ranks: element i of the result is true when it is true on any rank.
  using AnyRank = std::function<std::vector<bool>(const std::vector<bool>&)>;

  RerunStateMachine(const RerunConfig& config, std::vector<ValidationCall> calls, int rank, int world_size,
                    Hardware hardware, uint64_t seed, bool can_checkpoint, AnyRank any_rank);

  RerunMode mode() const { return mode_; }
  const std::vector<ValidationCall>& calls() const { return calls_; }

  PassPlan begin_iteration(int64_t iteration);
  // The pass's values (every rank the same): what the trainer does next.
  PassOutcome after_pass(double loss, double grad_norm);

  // A loaded checkpoint carried `record` (Megatron's load_state_dict): the next iteration is re-run
  // once on this job's hardware and judged. Ignored with --rerun-mode disabled and when the parallel
  // layout changed (`same_layout` false), as Megatron does. UserError when this run does not make
  // the validation call that rejected the result.
  void resume_from(const RerunRecord& record, bool same_layout);
  // The record of the checkpoint a kStop with save_checkpoint asks for (every rank's suspects: the
  // trainer gathers them with gather_suspects).
  RerunRecord record() const;
  // This rank's entry of the record's suspects (empty when it is not one).
  std::vector<std::pair<int, Hardware>> own_suspect_entry() const;
  void set_suspects(std::vector<std::pair<int, Hardware>> suspects) { suspects_ = std::move(suspects); }

  int64_t warnings() const { return warnings_; }  // non-fatal rejections reported so far

 private:
  enum class State {
    kNotRunningYet,
    kInitialRun,
    kRerunningInPlace,
    kWillRerunFromCheckpoint,
    kRerunningFromCheckpoint,
  };

  double value_of(const ValidationCall& call) const;
  double threshold(const ValidationCall& call) const;
  // is_unexpectedly_large's sampling of a value judged by `call`.
  void sample(const ValidationCall& call, double value);
  PassOutcome judge_first_result();       // disabled (and a job's first iteration)
  PassOutcome judge_initial_run();        // validate_results
  PassOutcome judge_rerun_in_place();
  PassOutcome judge_rerun_from_checkpoint();
  PassOutcome report_stats_pass();
  PassOutcome stop(int status, std::string conclusion, bool save = false);
  // Megatron's log_failure: "Rank R, node N, device D, iteration #I: <message>!" (error when fatal).
  void log_failure(const std::string& message, bool fatal) const;
  void track(ValidationStatus status, double value, const ValidationCall& call) const;
  bool reporting() const;  // this rank logs the diagnosis (the injecting rank, else rank 0)
  std::string what(const ValidationCall& call, double value) const;

  RerunMode mode_;
  std::vector<ValidationCall> calls_;
  int rank_, world_size_;
  Hardware hardware_;
  bool can_checkpoint_;
  AnyRank any_rank_;
  std::string tracker_file_;
  ErrorInjector injector_;

  State state_ = State::kNotRunningYet;
  bool first_iteration_complete_ = false;
  bool logged_enabled_ = false;
  int64_t iteration_ = 0;
  PassPlan plan_;
  double loss_ = 0, grad_norm_ = 0;  // the pass being judged
  int injected_call_ = -1, injecting_rank_ = -1;
  std::optional<size_t> failed_call_;
  double initial_result_ = 0;
  std::vector<double> initial_values_;  // report_stats: the first pass's value of each call
  std::vector<std::pair<int, Hardware>> suspects_;
  std::map<std::string, std::pair<int64_t, double>> large_values_;  // context -> count, largest
  std::vector<DeterminismStats> stats_;  // report_stats, per call
  int64_t warnings_ = 0;
};

// Megatron's exit codes.
inline constexpr int kExitResumeToDisambiguate = 16;
inline constexpr int kExitFailedOnResultValidation = 17;

}  // namespace fp8tron::rerun
