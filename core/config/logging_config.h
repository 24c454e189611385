// What the run reports: iteration lines, timers, TensorBoard, Weights & Biases.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace fp8tron {

// --wandb-*: a W&B run, written by the last rank as Megatron's _set_wandb_writer.
struct WandbConfig {
  std::string project;   // --wandb-project: W&B logging is on when it is not empty
  std::string exp_name;  // --wandb-exp-name ("": W&B names the run)
  std::string entity;    // --wandb-entity ("": the account's default entity)
  std::string save_dir;  // --wandb-save-dir, else <--save>/wandb (Megatron's default)
  bool enabled() const { return !project.empty(); }
};

struct LoggingConfig {
  int64_t log_interval = 100;
  bool log_throughput = false;
  bool log_params_norm = false;
  int timing_log_level = 0;
  std::string timing_log_option = "minmax";  // max | minmax | all: how timers across ranks are printed
  std::string tensorboard_dir;
  int64_t tensorboard_log_interval = 1;
  bool log_timers_to_tensorboard = false;          // "<timer>-time", the maximum over ranks
  bool log_validation_ppl_to_tensorboard = false;  // "lm loss validation ppl"
  bool log_memory_to_tensorboard = false;          // "mem-reserved-bytes", ... (CUDA allocator)
  bool log_world_size_to_tensorboard = false;      // "world-size"
  bool log_fp8_stats_to_tensorboard = false;  // per-layer FP8 cast statistics (Fp8Engine::collect_stats)
  bool log_loss_scale_to_tensorboard = true;       // "loss-scale" (off: --no-log-loss-scale-to-tensorboard)
  bool log_all_ranks = false;
  bool log_num_zeros_in_grad = false;              // " num zeros:" and TensorBoard "num-zeros"
  WandbConfig wandb;
  // --logging-level, else MEGATRON_LOGGING_LEVEL (a Python logging level); unset: fp8tron's 20.
  std::optional<int> logging_level;
};

// Megatron's --profile family: which iterations (counted from 0, [start, end)) of which ranks are
// profiled, and how (an Nsight Systems capture range, or the PyTorch/Kineto profiler).
struct ProfilingConfig {
  bool enabled = false;             // --profile
  int64_t step_start = 10;          // --profile-step-start
  int64_t step_end = 12;            // --profile-step-end
  std::vector<int> ranks = {0};     // --profile-ranks
  bool pytorch_profiler = false;    // --use-pytorch-profiler (trace into --tensorboard-dir)
  bool record_shapes = false;       // --pytorch-profiler-collect-shapes
};

}  // namespace fp8tron
