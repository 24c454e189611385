// The --recompute-* flags -> RecomputeConfig, with Megatron's rewrites (--recompute-activations
// means selective granularity; core_attn is the default module), and the named rule that refuses
// what Megatron refuses (arguments.py and TransformerConfig.__post_init__), each by its flags.
#pragma once
#include <string>
#include <vector>

#include "core/config/config.h"
#include "trainer/cli/flags.h"

namespace fp8tron {

// Flags given without effect (Megatron ignores them silently) become lines in `notices`.
RecomputeConfig build_recompute_config(const FlagValues& flags, std::vector<std::string>& notices);

// "" when the configuration's recomputation settings are valid, else one line naming the flags.
std::string recompute_problem(const Config& c, const FlagValues& flags);

}  // namespace fp8tron
