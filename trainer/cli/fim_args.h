// --fim-data and its flags -> FimConfig, with Megatron's defaults, and the checks that need only
// the flags and the data source (the tokenizer's own check is data::fim_options, run when the
// tokenizer is built).
#pragma once
#include <string>
#include <vector>

#include "core/config/data_config.h"
#include "trainer/cli/flags.h"

namespace fp8tron {

// `warnings`: FIM flags given without --fim-data. Throws a UserError for a rate outside [0, 1]
// and for --fim-split-sample without --fim-fragment-rate.
FimConfig build_fim_config(const FlagValues& flags, std::vector<std::string>& warnings);

// The data source and tokenizer type --fim-data needs; "" when they fit.
std::string fim_data_problem(const DataConfig& data);

}  // namespace fp8tron
