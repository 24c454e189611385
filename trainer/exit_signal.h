// Megatron's --exit-signal-handler: while training runs, the chosen signal (SIGTERM by default)
// only sets a flag; at the next iteration boundary the ranks agree whether any of them got it,
// save a checkpoint and leave the loop cleanly. Torch-free.
#pragma once
#include <csignal>

namespace fp8tron {

class ExitSignalHandler {
 public:
  // Installs the handler; the destructor puts the previous one back. One at a time per process.
  explicit ExitSignalHandler(int signal);
  ExitSignalHandler(const ExitSignalHandler&) = delete;
  ExitSignalHandler& operator=(const ExitSignalHandler&) = delete;
  ~ExitSignalHandler();

  // Whether this process received the signal since the handler was installed.
  bool received() const;

 private:
  int signal_;
  struct sigaction previous_ {};
};

}  // namespace fp8tron
