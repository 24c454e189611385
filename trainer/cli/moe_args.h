// The --num-experts / --moe-* flags -> MoeConfig, with Megatron's rewrites (--num-experts 0 = no
// MoE, one-element lists become scalars, a negative capacity factor = dropless, the
// --moe-router-padding-for-fp8 alias, --moe-ffn-hidden-size defaulting to --ffn-hidden-size).
// What is refused lives in validation.cpp as named rules.
#pragma once
#include <string>
#include <vector>

#include "core/config/model_config.h"
#include "trainer/cli/flags.h"

namespace fp8tron {

// `m` holds the dense model already (num_layers, ffn_hidden_size). Warnings go to `notices`.
MoeConfig build_moe_config(const FlagValues& flags, const ModelConfig& m, std::vector<std::string>& notices);

}  // namespace fp8tron
