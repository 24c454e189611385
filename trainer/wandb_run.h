// The W&B run of a training run (--wandb-project). Megatron-LM opens it on the last rank
// (_set_wandb_writer) before building the model; so does fp8tron, so that a missing wandb package
// or a failing wandb.init stops the job with one line before anything is allocated.
#pragma once
#include <memory>

#include "core/config/config.h"
#include "trainer/logging/wandb_writer.h"

namespace fp8tron {

// The writer on the last rank when --wandb-project is given; nullptr elsewhere. The logger runs on
// FP8TRON_WANDB_PYTHON, else the Python the build was configured with (the project's .venv, where
// scripts/setup.sh installs wandb), from wandb_logger.py beside the executable. Throws UserError
// (one line naming the fix) when it cannot start.
std::unique_ptr<WandbWriter> start_wandb_run(const Config& config);

}  // namespace fp8tron
