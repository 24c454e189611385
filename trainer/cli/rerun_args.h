// Megatron's rerun engine flags (--rerun-mode, --error-injection-rate, --error-injection-type,
// --result-rejected-tracker-filename) -> RerunConfig, and --iterations-to-skip with the
// iterations the tracker file's records name (Megatron's validate_args adds them).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/config/config.h"
#include "trainer/cli/flags.h"

namespace fp8tron {

// `warnings`: flags given without effect in the combination; `notices`: the iterations the tracker
// file adds.
RerunConfig build_rerun_config(const FlagValues& flags, const NumericsChecks& checks, std::vector<std::string>& warnings);
std::vector<int64_t> build_iterations_to_skip(const FlagValues& flags, std::vector<std::string>& notices);

}  // namespace fp8tron
