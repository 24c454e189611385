// The run itself: batch sizes, iterations, evaluation, the optimizer and its LR/weight-decay
// schedule.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/config/rerun_config.h"

namespace fp8tron {

// --rampup-batch-size START INCREMENT SAMPLES (Megatron's classic batch-size ramp-up): the global
// batch grows from START by INCREMENT over SAMPLES consumed samples, then stays at
// --global-batch-size.
struct BatchRampup {
  int64_t start = 0, increment = 0, samples = 0;
};

// Megatron's checks of the loss and gradients (trainer/numerics_guard.h), judged as RerunConfig says.
struct NumericsChecks {
  // --check-for-nan-in-loss-and-grad (on; --no-...): stop at the first non-finite loss or
  // gradient norm. Off with fp16's dynamic loss scale, whose overflow skips are expected.
  bool nan_in_loss_and_grad = true;
  bool spiky_loss = false;   // --check-for-spiky-loss: warn at a loss >= 10x the first 100's largest
  bool large_grads = false;  // --check-for-large-grads: same for the gradient norm
  // Hidden test flag --fp8tron-test-inject-nan ITER[:PARAM]: at iteration ITER the loss (or the
  // gradient of PARAM) becomes NaN.
  int64_t test_nan_iteration = 0;
  std::string test_nan_param;
};

// --cuda-graph-impl full_iteration (or --enable-cuda-graph / --cuda-graph-impl local with
// --cuda-graph-scope full_iteration, Megatron's older spelling): each step's forward and backward
// passes as one CUDA graph (trainer/step_graph.h).
struct CudaGraphConfig {
  bool full_iteration = false;
  int64_t warmup_steps = 3;  // --cuda-graph-warmup-steps: eager steps before the capture
};

struct TrainingConfig {
  int64_t micro_batch_size = 0;
  int64_t global_batch_size = 0;
  int64_t num_micro_batches = 0;  // global / (micro * dp)
  // --eval-global-batch-size: the sequences of one evaluation iteration (Megatron's default: the
  // global batch size after any ramp-up), in eval_micro_batches micro-batches per rank.
  int64_t eval_global_batch_size = 0;
  int64_t eval_micro_batches = 0;
  // --eval-micro-batch-size: the sequences of one evaluation micro-batch (default: micro_batch_size).
  int64_t eval_micro_batch_size = 0;
  int64_t train_iters = 0;
  std::optional<int64_t> train_samples;
  std::optional<int64_t> exit_interval;
  std::optional<int64_t> exit_duration_in_mins;
  int64_t eval_interval = 1000;
  int64_t eval_iters = 100;
  std::optional<int64_t> start_eval_at_iter;  // evaluations before this iteration are skipped
  uint64_t seed = 1234;
  bool deterministic = false;  // --deterministic-mode (trainer/determinism.h)
  std::optional<BatchRampup> rampup;   // --rampup-batch-size (sample-based training only)
  // --step-batch-size-schedule as (consumed samples from which, global batch size), ascending from 0.
  std::vector<std::pair<int64_t, int64_t>> step_batch_schedule;
  bool decrease_batch_size_if_needed = false;  // with a ramp-up: round the batch down to mbs x dp
  // --calculate-per-token-loss: the loss is summed over tokens and the gradients divided by the
  // global batch's loss-token count, instead of averaging each micro-batch's mean.
  bool calculate_per_token_loss = false;
  std::optional<int64_t> weight_hash_interval;  // --check-weight-hash-across-dp-replicas-interval
  NumericsChecks numerics;
  RerunConfig rerun;  // --rerun-mode and its companions: how the numerics checks judge a result
  // --iterations-to-skip (and the iterations --result-rejected-tracker-filename's records name):
  // 1-indexed iterations that run no step; their samples are consumed and counted as skipped.
  std::vector<int64_t> iterations_to_skip;
  CudaGraphConfig cuda_graph;
};

// --optimizer muon: Megatron's TensorParallelMuon (Emerging-Optimizers' Muon) for the 2-D hidden
// weights, the scalar optimizer (Adam) for the rest.
struct MuonConfig {
  double momentum = 0.9;                  // --muon-momentum
  bool nesterov = false;                  // --muon-nesterov
  bool split_qkv = true;                  // !--muon-no-split-qkv
  std::string scale_mode = "spectral";    // spectral | unit_rms_norm | shape_scaling
  std::string matmul_precision = "medium";  // --muon-fp32-matmul-prec: medium = bf16 iterations, high = fp32
  std::string coefficient_type = "quintic";
  int64_t num_ns_steps = 5;
  std::string tp_mode = "duplicated";     // blockwise | duplicated | distributed
  double extra_scale_factor = 1.0;
};

// The storage dtype of an optimizer state (--exp-avg-dtype, --exp-avg-sq-dtype): the update math is
// fp32 whatever it is. Fp16 and Fp8 are Transformer Engine's states scaled per parameter
// (optim/scaled_state.h).
enum class StateDtype { Fp32, Bf16, Fp16, Fp8 };

// --use-precision-aware-optimizer (Transformer Engine's FusedAdam with master_weights and
// low-precision states, as Megatron drives it): Adam's moments stored in `exp_avg` /
// `exp_avg_sq`, the main weights in `main_params` (fp32, or fp16 scaled per parameter). The main
// gradients' dtype (--main-grads-dtype) is PrecisionConfig::grads_in_fp32.
struct PrecisionAwareOptimizer {
  bool enabled = false;
  StateDtype exp_avg = StateDtype::Fp32;
  StateDtype exp_avg_sq = StateDtype::Fp32;
  StateDtype main_params = StateDtype::Fp32;
};

struct OptimizerConfig {
  std::string optimizer = "adam";  // adam (AdamW) | sgd | muon
  double lr = 0;
  double min_lr = 0;
  double weight_decay = 0.01;
  double clip_grad = 1.0;
  double adam_beta1 = 0.9, adam_beta2 = 0.999, adam_eps = 1e-8;
  double sgd_momentum = 0.9;
  // --decoupled-lr / --decoupled-min-lr: the word embedding and the output layer get their own
  // peak (and minimum) learning rate on the same schedule.
  std::optional<double> decoupled_lr, decoupled_min_lr;
  bool apply_wd_to_qk_layernorm = false;  // --apply-wd-to-qk-layernorm: QK norms get weight decay
  MuonConfig muon;
  // --use-mup: the width multiplier (hidden size / --mup-base-hidden-size) that Megatron's
  // get_mup_config_overrides scales learning rates and Adam epsilon by (optim/param_groups.h).
  std::optional<double> mup_width_mult;
  PrecisionAwareOptimizer precision_aware;
};

enum class DecayStyle { Constant, Linear, Cosine, InverseSquareRoot, WSD };
enum class WsdDecayStyle { Exponential, Linear, Cosine, MinusSqrt };
enum class WeightDecayIncrStyle { Constant, Linear, Cosine };

// Megatron's OptimizerParamScheduler; every "steps" count is in samples.
struct LrScheduleConfig {
  double init_lr = 0;  // --lr-warmup-init
  double max_lr = 0;
  double min_lr = 0;
  double warmup_steps = 0;  // a float as in Megatron (--lr-warmup-fraction x decay steps)
  int64_t decay_steps = 0;
  DecayStyle decay_style = DecayStyle::Linear;
  WsdDecayStyle wsd_decay_style = WsdDecayStyle::Exponential;
  int64_t wsd_decay_steps = 0;
  double start_wd = 0.01, end_wd = 0.01;
  int64_t wd_incr_steps = 0;
  WeightDecayIncrStyle wd_incr_style = WeightDecayIncrStyle::Constant;
};

}  // namespace fp8tron
