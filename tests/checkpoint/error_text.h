// The message of the UserError a statement throws, or "" when it throws none: the checkpoint
// tests check what a user reads (which file, what differs) piece by piece.
#pragma once
#include <functional>
#include <string>

#include "core/error.h"

namespace fp8tron::checkpoint::testing {

inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

}  // namespace fp8tron::checkpoint::testing
