// Megatron's --use-checkpoint-args: the model's arguments are taken from the checkpoint being
// loaded, overriding the command line (Megatron's load_args_from_checkpoint with force=True).
// The parallel layout stays this run's (checkpoints reshard on load), unless
// --use-mp-args-from-checkpoint-args takes the saved run's as well. Torch-free.
#pragma once
#include "trainer/cli/flags.h"

namespace fp8tron {

// When --use-checkpoint-args is set: reads the metadata of the checkpoint --load names (the
// tracker's, or --ckpt-step; fp8tron's own, or the argparse namespace a Megatron-LM torch_dist or
// torch checkpoint stores) and sets the model flags from its arguments, and the tokenizer model
// unless --no-use-tokenizer-model-from-checkpoint-args, logging each change as Megatron does
// ("Setting num_layers to 24 from checkpoint"). UserError without --load or when there is no
// checkpoint to read.
void apply_checkpoint_args(FlagValues& flags);

}  // namespace fp8tron
