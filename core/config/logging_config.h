// What the run reports: iteration lines, timers, TensorBoard.
#pragma once
#include <cstdint>
#include <string>

namespace fp8tron {

struct LoggingConfig {
  int64_t log_interval = 100;
  bool log_throughput = false;
  bool log_params_norm = false;
  int timing_log_level = 0;
  std::string timing_log_option = "minmax";
  std::string tensorboard_dir;
  int64_t tensorboard_log_interval = 1;
  bool log_all_ranks = false;
};

}  // namespace fp8tron
