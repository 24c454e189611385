// A run's checkpoints (Megatron's --save/--load, checkpoint/): loading at the start, saving
// synchronously or asynchronously, the re-run record they carry, and Megatron's
// checkpoint_and_decide_exit after every iteration (an exit signal, the save interval, the time
// limit, the exit interval).
#pragma once
#include <chrono>
#include <memory>
#include <optional>

#include "checkpoint/async_saver.h"
#include "checkpoint/training_state.h"
#include "trainer/exit_signal.h"
#include "trainer/run_parts.h"
#include "trainer/run_progress.h"

namespace fp8tron {

class RunCheckpoints {
 public:
  using Clock = std::chrono::steady_clock;
  RunCheckpoints(RunParts& parts, RunProgress& progress);

  // Loads --load when there is a checkpoint (weights, optimizer, schedules, counters, RNG, the
  // re-run record) and returns the first iteration to run. With --async-save the snapshot's host
  // memory starts being reserved in the background first.
  int64_t load();
  // The state a checkpoint saves and restores.
  TrainingState state();
  void save(int64_t iteration, bool non_persistent = false);
  // Saves the state from before iteration `iteration + 1` with the rerun engine's record (a
  // fault's checkpoint for a re-run elsewhere). Returns the iteration of the latest checkpoint
  // saved before it, which retention keeps (none when --save held none).
  std::optional<int64_t> save_for_rerun(int64_t iteration, const rerun::RerunRecord& record);
  // Megatron's checkpoint_and_decide_exit: whether the loop ends after `iteration`.
  bool save_and_decide_exit(int64_t iteration, Clock::time_point start, const ExitSignalHandler* signal);
  // Whether the loop ended on an orderly shutdown (--exit-signal-handler-for-training): nothing
  // more is saved or evaluated.
  bool shutting_down() const { return shutting_down_; }
  // Commits an asynchronous save in flight, waiting for its writer.
  void finish();

 private:
  RunParts& parts_;
  MegatronSaveInfo megatron_;  // what torch_dist saves record of the run (--ckpt-format torch_dist)
  RunProgress& progress_;
  RerunCheckpointIo rerun_io_;                         // the re-run record into and out of checkpoints
  std::unique_ptr<AsyncCheckpointSaver> async_saver_;  // --async-save
  bool shutting_down_ = false;
};

}  // namespace fp8tron
