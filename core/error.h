// Errors. A UserError is bad input (flags, configs, data files, checkpoints): main() prints its
// message as one line and exits with status 1. FP8TRON_CHECK guards internal invariants and
// carries file, line and function so a bug report points at the code.
#pragma once
#include <stdexcept>
#include <string>

namespace fp8tron {

class UserError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A run that ends on purpose with an exit status of its own, e.g. the rerun engine's 16 (restart
// the job from the checkpoint just saved) and 17 (a result failed validation): main() prints the
// message as one line and exits with the status.
class RunEnd : public std::runtime_error {
 public:
  RunEnd(int status, const std::string& message) : std::runtime_error(message), status_(status) {}
  int status() const { return status_; }

 private:
  int status_;
};

[[noreturn]] void throw_internal_error(const char* file, int line, const char* func,
                                       const std::string& message);

}  // namespace fp8tron

#define FP8TRON_CHECK(cond, message)                                                  \
  do {                                                                                \
    if (!(cond)) ::fp8tron::throw_internal_error(__FILE__, __LINE__, __func__,        \
                                                 std::string("check failed: " #cond ": ") + (message)); \
  } while (0)
