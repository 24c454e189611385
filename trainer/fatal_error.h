// What main() prints when a run ends on an exception: one line, never a LibTorch backtrace.
// Running out of memory is the user's to fix (a smaller micro-batch, recomputation, more
// sharding), so it is an error with those fixes named, not an "internal error".
#pragma once
#include <exception>
#include <string>

namespace fp8tron {

struct FatalReport {
  std::string line;   // printed to stderr as is (starts with "fp8tron: ")
  int exit_code = 2;  // 1: bad input or not enough memory; 2: a bug
};

// `rank` is the global rank when known (-1 before the launch environment was read).
FatalReport report_fatal_error(const std::exception& e, int rank);

}  // namespace fp8tron
