// The LR / weight-decay schedule in checkpoints, as Megatron's OptimizerParamScheduler stores it
// (max_lr, min_lr, warmup and decay steps, decay style, the weight-decay schedule), and Megatron's
// rule on resume: a run whose schedule differs from the checkpoint's is refused, unless
// --override-opt-param-scheduler (this run's schedule wins) or --use-checkpoint-opt_param-scheduler
// (the checkpoint's wins).
#pragma once
#include <string>

#include "core/config/training_config.h"
#include "checkpoint/metadata.h"

namespace fp8tron {

checkpoint::SchedulerState scheduler_state(const LrScheduleConfig& c);

enum class SchedulerSource { kMustMatch, kCommandLine, kCheckpoint };

// The schedule to continue with (Megatron's load_state_dict): kMustMatch throws UserError naming
// every value that differs and both flags; kCommandLine keeps `mine`; kCheckpoint takes the
// checkpoint's values (this run's --lr-warmup-init and WSD annealing stay, as Megatron does not
// store them). Logs what it took, as Megatron does.
LrScheduleConfig resolve_schedule(const LrScheduleConfig& mine, const checkpoint::SchedulerState& saved,
                                  SchedulerSource source, const std::string& checkpoint_path);

}  // namespace fp8tron
