// --load of a checkpoint that Megatron-LM wrote (megatron/megatron_checkpoint.h): its weights,
// Adam's moments and step, the iteration, the consumed samples and the LR/WD schedule go into
// fp8tron's model and optimizer, in any of fp8tron's parallel layouts. Its names and shapes are
// checked against the model first; then each rank reads what it holds (of a torch_dist checkpoint
// only the chunks that overlap its own parts), and writes nothing until every rank has read all of
// it, so a mismatch or a damaged file leaves nothing half-loaded.
#pragma once
#include <cstdint>
#include <string>

#include "checkpoint/checkpoint_dir.h"
#include "checkpoint/training_state.h"

namespace fp8tron {

// Loads the checkpoint at `location` in Megatron's `format` ("torch_dist" or "torch"), honouring
// --finetune and --no-load-optim. Returns the iteration to continue from.
int64_t load_megatron_checkpoint(const TrainingState& s, const checkpoint::CheckpointLocation& location,
                                 const std::string& format);

}  // namespace fp8tron
