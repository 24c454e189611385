// The fine-grained activation offloading flags (--fine-grained-activation-offloading,
// --offload-modules, --min-offloaded-tensor-size, ...) -> OffloadConfig, and the named rule that
// refuses what Megatron refuses (TransformerConfig.__post_init__, arguments.py) or fp8tron cannot
// combine with offloading, each by its flags.
#pragma once
#include <string>
#include <vector>

#include "core/config/config.h"
#include "trainer/cli/flags.h"

namespace fp8tron {

// Flags given without effect become lines in `notices`.
OffloadConfig build_offload_config(const FlagValues& flags, std::vector<std::string>& notices);

// "" when the offloading settings are valid, else one line naming the flags.
std::string offload_problem(const Config& c, const FlagValues& flags);

}  // namespace fp8tron
