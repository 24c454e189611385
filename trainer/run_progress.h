// Where a run stands: the counters, schedules and last step result that the step advances, the
// reports read and a checkpoint saves and restores. Megatron keeps these as globals and arguments;
// here one object, owned by the loop and handed to the parts that need it.
#pragma once
#include <torch/torch.h>

#include <cstdint>

#include "core/config/batch_schedule.h"
#include "core/config/config.h"
#include "optim/loss_scaler.h"
#include "optim/lr_schedule.h"
#include "optim/mixed_precision_optimizer.h"

namespace fp8tron {

struct RunProgress {
  RunProgress(const Config& c, int data_parallel_size)
      : schedule(c.lr_schedule), batches(BatchSchedule::of(c.training, data_parallel_size)), scaler(c.precision) {}

  LrSchedule schedule;
  BatchSchedule batches;
  LossScaler scaler;
  int64_t iteration = 0;              // the iteration the step runs
  int64_t micro_batches = 0;          // of the current step
  int64_t current_global_batch = 0;   // the global batch size Megatron reports for the current step
  int64_t consumed_train_samples = 0, consumed_valid_samples = 0;
  int64_t skipped_train_samples = 0;  // --iterations-to-skip
  int64_t last_saved_iteration = -1;
  StepResult last_step;               // the optimizer's last step: gradient norm, skipped, zeros
};

}  // namespace fp8tron
