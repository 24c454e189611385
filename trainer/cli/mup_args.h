// --use-mup and the --mup-* flags -> MupConfig, derived as Megatron-Core's TransformerConfig
// derives it (width multiplier, softmax scale, automatic output multiplier), and Megatron's
// start-up warnings about MuP's interplay with the optimizer.
#pragma once
#include <string>
#include <vector>

#include "core/config/model_config.h"
#include "core/config/training_config.h"
#include "trainer/cli/flags.h"

namespace fp8tron {

// `m` holds the model's sizes already (hidden_size, kv_channels).
MupConfig build_mup_config(const FlagValues& flags, const ModelConfig& m);

// Megatron's get_mup_config_overrides warnings for this optimizer (--decoupled-lr keeps the
// embedding and output layer out of MuP's learning-rate scaling; Muon's spectral scale mode
// stays on Muon's matrices).
std::vector<std::string> mup_optimizer_warnings(const MupConfig& mup, const OptimizerConfig& optimizer);

}  // namespace fp8tron
