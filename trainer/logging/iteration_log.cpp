#include "trainer/logging/iteration_log.h"

#include <chrono>
#include <cmath>
#include <ctime>

#include "core/text.h"

namespace fp8tron {

std::string format_iteration_line(const IterationStats& s) {
  std::time_t now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%Y-%m-%d %H:%M:%S", std::localtime(&now));
  std::string line = strprintf(" [%s]", stamp);
  line += strprintf(" iteration %8lld/%8lld |", (long long)s.iteration, (long long)s.train_iters);
  line += strprintf(" consumed samples: %12lld |", (long long)s.consumed_samples);
  if (s.skipped_samples > 0) line += strprintf(" skipped samples: %12lld |", (long long)s.skipped_samples);
  line += strprintf(" elapsed time per iteration (ms): %.1f |", s.elapsed_ms_per_iteration);
  if (s.tflops_per_gpu) line += strprintf(" throughput per GPU (TFLOP/s/GPU): %.1f |", *s.tflops_per_gpu);
  line += strprintf(" learning rate: %.6E |", s.learning_rate);
  line += strprintf(" global batch size: %5lld |", (long long)s.global_batch_size);
  line += strprintf(" lm loss: %.6E |", s.lm_loss);
  // Megatron's total_loss_dict order: the MoE losses, then the MTP ones.
  for (const auto& [name, value] : s.moe_losses) line += strprintf(" %s: %.6E |", name.c_str(), value);
  for (size_t k = 0; k < s.mtp_losses.size(); ++k) line += strprintf(" mtp_%zu loss: %.6E |", k + 1, s.mtp_losses[k]);
  line += strprintf(" loss scale: %.1f |", s.loss_scale);
  if (s.grad_norm) line += strprintf(" grad norm: %.3f |", *s.grad_norm);
  if (s.num_zeros) line += strprintf(" num zeros: %lld |", (long long)*s.num_zeros);
  if (s.params_norm) line += strprintf(" params norm: %.3f |", *s.params_norm);
  line += strprintf(" number of skipped iterations: %3lld |", (long long)s.skipped_iterations);
  line += strprintf(" number of nan iterations: %3lld |", (long long)s.nan_iterations);
  line += strprintf(" tokens per second: %.0f |", s.tokens_per_second);
  return line;
}

std::string format_validation_block(const std::string& prefix, double lm_loss) {
  // Megatron caps the exponent to avoid overflow in PPL: exp(min(20, loss)).
  const double ppl = std::exp(std::min(20.0, lm_loss));
  std::string body = strprintf(" %s | lm loss value: %.6E | lm loss PPL: %.6E | ", prefix.c_str(), lm_loss, ppl);
  std::string dashes(body.size() + 1, '-');
  return dashes + "\n" + body + "\n" + dashes;
}

}  // namespace fp8tron
