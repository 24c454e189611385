// The training loop: micro-batches accumulated to the global batch, the mixed-precision
// optimizer, the LR schedule, loss scaling, evaluation, Megatron's log lines, TensorBoard.
#pragma once
#include <vector>

#include "trainer/config.h"

namespace fp8tron {

struct TrainResult {
  std::vector<double> losses;  // lm loss of every iteration (nan for non-finite ones)
  double last_validation_loss = 0;
  int64_t iterations = 0;      // iterations run (fewer than train_iters after an exit condition)
  int64_t consumed_samples = 0;
  std::vector<double> final_weights_sample;  // a few main-weight values, for determinism tests
};

TrainResult train(const Config& config);

bool cuda_available();

}  // namespace fp8tron
