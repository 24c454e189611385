#include "trainer/run_checkpoints.h"

#include "checkpoint/checkpoint_dir.h"
#include "checkpoint/load.h"
#include "checkpoint/save.h"
#include "checkpoint/save_torch_dist.h"
#include "core/error.h"
#include "core/log.h"
#include "core/text.h"
#include "trainer/cli/arguments_json.h"
#include "trainer/cli/model_math.h"

namespace fp8tron {

RunCheckpoints::RunCheckpoints(RunParts& parts, RunProgress& progress) : parts_(parts), progress_(progress) {
  if (parts_.config.checkpoint.save_torch_dist) {
    megatron_.arguments = arguments_json(parts_.config);
    const ModelConfig& m = parts_.config.model;
    megatron_.flops_per_sample = training_flops_per_token(m) * double(m.seq_length);
  }
}

TrainingState RunCheckpoints::state() {
  TrainingState s{parts_.config,  parts_.data_parallel, parts_.device, *parts_.optimizer, progress_.schedule,
                  progress_.scaler, progress_.consumed_train_samples, progress_.consumed_valid_samples, parts_.fp8.get()};
  for (auto& chunk : parts_.chunks)
    for (const auto& item : chunk->named_buffers()) s.buffers.emplace_back(item.key(), item.value());
  s.skipped_train_samples = &progress_.skipped_train_samples;
  s.rerun = &rerun_io_;
  if (parts_.config.checkpoint.save_torch_dist) s.megatron = &megatron_;
  return s;
}

int64_t RunCheckpoints::load() {
  const auto& k = parts_.config.checkpoint;
  if (k.async_save && !k.save.empty() && !k.save_torch_dist) {
    // The host memory of the snapshots is allocated in the background from now on.
    async_saver_ = std::make_unique<AsyncCheckpointSaver>();
    async_saver_->reserve(state());
  }
  const int64_t first_iteration = load_checkpoint(state()) + 1;
  if (rerun_io_.loaded) {
    parts_.rerun->resume_from(*rerun_io_.loaded, rerun_io_.loaded_same_layout);
    rerun_io_.loaded.reset();
  }
  // --fp8-param-gather: the loaded weights cast with the loaded FP8 scales, as the step that
  // saved them published them.
  if (parts_.fp8_param_gather && first_iteration > 1) parts_.optimizer->publish_model_params();
  return first_iteration;
}

void RunCheckpoints::save(int64_t iteration, bool non_persistent) {
  if (parts_.config.checkpoint.async_save) {
    if (!async_saver_) async_saver_ = std::make_unique<AsyncCheckpointSaver>();
    async_saver_->save(state(), iteration, non_persistent);
  } else if (parts_.config.checkpoint.save_torch_dist) {
    save_torch_dist_checkpoint(state(), iteration, non_persistent);
  } else {
    save_checkpoint(state(), iteration, non_persistent);
  }
  // A non-persistent checkpoint does not stand in for the persistent one at the end or on exit.
  if (!non_persistent) progress_.last_saved_iteration = iteration;
}

std::optional<int64_t> RunCheckpoints::save_for_rerun(int64_t iteration, const rerun::RerunRecord& record) {
  std::optional<int64_t> before;
  try {
    const auto tracker = checkpoint::read_tracker(parts_.config.checkpoint.save);
    if (tracker && !tracker->release) before = tracker->iteration;
  } catch (const UserError&) {
    // a garbage tracker names no checkpoint to go back to
  }
  rerun_io_.to_save = record;
  save(iteration);
  rerun_io_.to_save.reset();
  return before;
}

void RunCheckpoints::finish() {
  if (async_saver_) async_saver_->finalize(state(), /*blocking=*/true);
}

bool RunCheckpoints::save_and_decide_exit(int64_t iteration, Clock::time_point start, const ExitSignalHandler* signal) {
  const auto& t = parts_.config.training;
  const auto& k = parts_.config.checkpoint;
  const ParallelState& p = parts_.parallel;
  const bool saving = !k.save.empty();
  if (async_saver_) async_saver_->finalize(state(), /*blocking=*/false);  // commits a finished one
  if (signal) {
    // Every rank stops at the same iteration: a signal on any rank counts.
    auto got = torch::full({1}, signal->received() ? 1.0f : 0.0f, torch::TensorOptions().device(parts_.device));
    if (p.sizes.world_size > 1) p.world->all_reduce(got, ReduceOp::Max);
    if (got.item<float>() > 0) {
      if (!signal->saves()) {
        log::print("\nTermination requested. Performing orderly shutdown.");
        shutting_down_ = true;
        return true;
      }
      if (saving) save(iteration);
      log::print("exiting program after receiving " + k.exit_signal_name + ".");
      return true;
    }
  }
  if (saving && k.save_interval && iteration % *k.save_interval == 0)
    save(iteration);
  else if (saving && k.non_persistent_save_interval && iteration % *k.non_persistent_save_interval == 0)
    save(iteration, /*non_persistent=*/true);
  if (t.exit_duration_in_mins) {
    // Every rank must stop at the same iteration: rank 0's clock decides.
    auto over = torch::tensor({std::chrono::duration<double>(Clock::now() - start).count() / 60.0 >
                                       double(*t.exit_duration_in_mins) ? 1.0f : 0.0f});
    if (p.sizes.world_size > 1) {
      over = over.to(parts_.device);
      p.world->broadcast(over, 0);
    }
    if (over.item<float>() > 0) {
      if (saving && progress_.last_saved_iteration != iteration) save(iteration);
      log::print(strprintf("exiting program after %lld minutes", (long long)*t.exit_duration_in_mins));
      return true;
    }
  }
  if (t.exit_interval && iteration % *t.exit_interval == 0) {
    if (saving && progress_.last_saved_iteration != iteration) save(iteration);
    log::print(strprintf("exiting program at iteration %lld", (long long)iteration));
    return true;
  }
  return false;
}

}  // namespace fp8tron
