// --cp-comm-type and --hierarchical-context-parallel-sizes -> ContextParallelConfig, and the
// named rule that refuses the context-parallel layouts Megatron (and Transformer Engine's
// attention, which Megatron's runs through) refuses, each by its flags.
#pragma once
#include <string>

#include "core/config/config.h"
#include "trainer/cli/flags.h"

namespace fp8tron {

ContextParallelConfig build_context_parallel_config(const FlagValues& flags);

// "" when valid, else one line naming the flags.
std::string context_parallel_problem(const Config& c, const FlagValues& flags);

}  // namespace fp8tron
