// What to load instead of a checkpoint that cannot be loaded: the other complete iterations in
// its directory, for --ckpt-step.
#pragma once
#include <cstdint>
#include <string>

namespace fp8tron::checkpoint {

// "load another complete iteration with --ckpt-step N (complete iterations: 2, 4)", or, when
// `dir` holds no complete iteration but `iteration`, that there is none to fall back on.
std::string other_iterations_hint(const std::string& dir, int64_t iteration);

// `message` with that hint appended, unless it already names --ckpt-step.
std::string with_other_iterations(const std::string& message, const std::string& dir, int64_t iteration);

}  // namespace fp8tron::checkpoint
