// Megatron's log lines, field for field, so existing log parsers and habits carry over:
//  [2026-11-21 10:00:00] iteration       10/     100 | consumed samples:          320 | ...
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace fp8tron {

struct IterationStats {
  int64_t iteration = 0;
  int64_t train_iters = 0;
  int64_t consumed_samples = 0;
  int64_t skipped_samples = 0;  // --iterations-to-skip: printed when > 0
  double elapsed_ms_per_iteration = 0;
  std::optional<double> tflops_per_gpu;  // with --log-throughput
  double learning_rate = 0;
  int64_t global_batch_size = 0;
  double lm_loss = 0;
  std::vector<double> mtp_losses;  // multi-token prediction: " mtp_<k> loss:" for k = 1, 2, ...
  // Mixture of experts: load_balancing_loss, z_loss, ... (averaged over the interval), printed
  // after the lm loss as Megatron prints its total_loss_dict.
  std::vector<std::pair<std::string, double>> moe_losses;
  double loss_scale = 1;
  std::optional<double> grad_norm;
  std::optional<int64_t> num_zeros;   // with --log-num-zeros-in-grad
  std::optional<double> params_norm;  // with --log-params-norm
  int64_t skipped_iterations = 0;
  int64_t nan_iterations = 0;
  double tokens_per_second = 0;
};

std::string format_iteration_line(const IterationStats& s);

// The dashed block Megatron prints after evaluation:
//  validation loss at iteration 100 | lm loss value: 5.1E+00 | lm loss PPL: 1.6E+02 |
std::string format_validation_block(const std::string& prefix, double lm_loss);

}  // namespace fp8tron
