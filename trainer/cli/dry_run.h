// What --dry-run prints (and what training prints at start): the resolved arguments in
// Megatron's format, the parallel layout, parameter count, FLOPs per token and the memory plan.
#pragma once
#include <string>

#include "core/config/config.h"

namespace fp8tron {

std::string format_arguments(const Config& c);  // Megatron's "---- arguments ----" block
std::string format_plan(const Config& c);       // layout, parameters, FLOPs, memory per GPU

}  // namespace fp8tron
