// Megatron's --save/--load family (checkpoint/).
#pragma once
#include <cstdint>
#include <optional>
#include <string>

namespace fp8tron {

struct CheckpointConfig {
  std::string save, load;             // directories; "" = none
  std::optional<int64_t> save_interval;
  bool save_optim = true, save_rng = true;   // --no-save-optim, --no-save-rng
  bool load_optim = true, load_rng = true;   // --no-load-optim, --no-load-rng
  bool finetune = false;              // weights only, iteration and counters from 0
  bool load_main_params_from_ckpt = false;   // weights-only loads take the fp32 main weights
  std::optional<int64_t> ckpt_step;   // load this iteration instead of the tracker's
  // --pretrained-checkpoint: the checkpoint a fine-tuning run starts from when --load holds none,
  // loaded as --finetune loads (weights only, counters from zero); "" = none.
  std::string pretrained;
  // --override-ckpt-iteration: after a load, continue from this iteration, the consumed samples
  // recomputed as iteration x global batch size (the data loader replays from there).
  std::optional<int64_t> override_iteration;
  bool exit_on_missing_checkpoint = false;
  bool async_save = false;            // write in the background (AsyncCheckpointSaver)
  // Megatron's default: the data-parallel replicas of a tensor are written in equal parts by the
  // data-parallel ranks; --no-ckpt-fully-parallel-save: data-parallel rank 0 writes them.
  bool fully_parallel_save = true;
  std::string dist_ckpt_strictness = "assume_ok_unexpected";  // tensor mismatches on load (Megatron's values)
  // --ckpt-format and --auto-detect-ckpt-format: which of Megatron's own checkpoint formats --load
  // accepts (checkpoint/megatron/megatron_checkpoint.h); fp8tron's own format always loads.
  std::string ckpt_format = "torch_dist";
  bool auto_detect_ckpt_format = false;
  // --save with an explicit --ckpt-format torch_dist: checkpoints are written in Megatron's
  // torch_dist format (checkpoint/save_torch_dist.h), which Megatron-LM resumes; otherwise in
  // fp8tron's own format.
  bool save_torch_dist = false;
  // --ckpt-convert-format / --ckpt-convert-save: load, save at the loaded iteration into
  // <ckpt-convert-save>/<format> (`save` is that directory) and exit without training.
  std::string convert_format;
  // Only the checkpoints of iterations that are multiples of this (and the latest) are kept.
  std::optional<int64_t> save_retain_interval;
  // Non-persistent checkpoints (Megatron's "global" type): every non_persistent_save_interval
  // iterations into non_persistent_dir, only the latest kept; loads take the newer of the two.
  std::optional<int64_t> non_persistent_save_interval;
  bool non_persistent_global = false;  // --non-persistent-ckpt-type global
  std::string non_persistent_dir;      // --non-persistent-global-ckpt-dir; "": <save or load>/non_persistent
  // Each stored tensor's checksum is verified on load (--no-verify-integrity: not).
  bool verify_checksums = true;
  // On resume, a schedule that differs from the checkpoint's is refused unless this run's
  // (--override-opt-param-scheduler) or the checkpoint's (--use-checkpoint-opt_param-scheduler)
  // is taken (Megatron's OptimizerParamScheduler rules).
  bool override_opt_param_scheduler = false;
  bool use_checkpoint_opt_param_scheduler = false;
  // A second job saving into the same directory is refused (a lock file in --save).
  bool lock_save_dir = true;
  std::string test_kill_at;           // hidden test flag --fp8tron-test-kill-at (checkpoint/fault_points.h)
  bool exit_signal_handler = false;   // save and exit at the next iteration on exit_signal
  bool exit_signal_handler_for_training = false;  // SIGINT/SIGTERM: leave at the next iteration, no save
  int exit_signal = 15;               // SIGTERM
  std::string exit_signal_name = "SIGTERM";
};

}  // namespace fp8tron
