// Loading a checkpoint (Megatron's --load): the weights, the optimizer state, the schedule, the
// loss scaler, the FP8 recipe state, the consumed samples and the RNG states, resharded when the
// checkpoint was saved in another layout.
#pragma once
#include <cstdint>

#include "checkpoint/training_state.h"

namespace fp8tron {

// Every rank, after the model and optimizer are built: loads --load (the tracker's iteration or
// --ckpt-step) honouring --finetune, --no-load-optim, --no-load-rng and
// --load-main-params-from-ckpt. Returns the iteration to continue from; 0 when nothing was loaded
// or with --finetune.
int64_t load_checkpoint(const TrainingState& state);

}  // namespace fp8tron
