// --logging-level and the MEGATRON_LOGGING_LEVEL environment variable (Megatron's setup_logging,
// megatron/training/initialize.py): the flag wins over the variable; with neither, fp8tron keeps
// its default level (20, INFO). The level is a Python logging level as an integer (10 DEBUG,
// 20 INFO, 30 WARNING, 40 ERROR, 50 CRITICAL, or any other integer: records below it are
// dropped). core/log.h says which lines it filters.
#pragma once
#include <optional>
#include <string>

#include "trainer/cli/determinism_env.h"
#include "trainer/cli/flags.h"

namespace fp8tron {

// The level, or nullopt when neither the flag nor the variable is given. Throws UserError when
// the variable is not an integer as Python's int() reads it (Megatron fails on it too).
std::optional<int> resolve_logging_level(const FlagValues& flags, const EnvLookup& lookup);

// Python's int() of a decimal string: surrounding whitespace, an optional sign, digits with
// single underscores between them. Values beyond int's range saturate (they keep their meaning:
// everything or nothing is shown). nullopt when `text` is not such an integer.
std::optional<int> parse_python_int(const std::string& text);

}  // namespace fp8tron
