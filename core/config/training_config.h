// The run itself: batch sizes, iterations, evaluation, the optimizer and its LR/weight-decay
// schedule.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

namespace fp8tron {

// Megatron's checks of the loss and gradients (trainer/numerics_guard.h).
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

struct TrainingConfig {
  int64_t micro_batch_size = 0;
  int64_t global_batch_size = 0;
  int64_t num_micro_batches = 0;  // global / (micro * dp)
  int64_t train_iters = 0;
  std::optional<int64_t> train_samples;
  std::optional<int64_t> exit_interval;
  std::optional<int64_t> exit_duration_in_mins;
  int64_t eval_interval = 1000;
  int64_t eval_iters = 100;
  std::optional<int64_t> start_eval_at_iter;  // evaluations before this iteration are skipped
  uint64_t seed = 1234;
  bool deterministic = false;  // --deterministic-mode (trainer/determinism.h)
  NumericsChecks numerics;
};

struct OptimizerConfig {
  std::string optimizer = "adam";  // adam (AdamW) | sgd
  double lr = 0;
  double min_lr = 0;
  double weight_decay = 0.01;
  double clip_grad = 1.0;
  double adam_beta1 = 0.9, adam_beta2 = 0.999, adam_eps = 1e-8;
  double sgd_momentum = 0.9;
};

enum class DecayStyle { Constant, Linear, Cosine, InverseSquareRoot, WSD };
enum class WsdDecayStyle { Exponential, Linear, Cosine, MinusSqrt };
enum class WeightDecayIncrStyle { Constant, Linear, Cosine };

// Megatron's OptimizerParamScheduler; every "steps" count is in samples.
struct LrScheduleConfig {
  double init_lr = 0;  // --lr-warmup-init
  double max_lr = 0;
  double min_lr = 0;
  int64_t warmup_steps = 0;
  int64_t decay_steps = 0;
  DecayStyle decay_style = DecayStyle::Linear;
  WsdDecayStyle wsd_decay_style = WsdDecayStyle::Exponential;
  int64_t wsd_decay_steps = 0;
  double start_wd = 0.01, end_wd = 0.01;
  int64_t wd_incr_steps = 0;
  WeightDecayIncrStyle wd_incr_style = WeightDecayIncrStyle::Constant;
};

}  // namespace fp8tron
