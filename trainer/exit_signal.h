// Exit signals caught while training runs: the handler only sets a flag; at the next iteration
// boundary the ranks agree whether any of them got one and leave the loop cleanly.
//  - Megatron's --exit-signal-handler: the chosen signal (SIGTERM by default); a checkpoint is
//    saved first.
//  - Megatron's --exit-signal-handler-for-training: SIGINT and SIGTERM, an orderly shutdown
//    without a save ("Termination requested. Performing orderly shutdown."). Megatron leaves
//    from inside its handler, mid-iteration; fp8tron at the iteration boundary, so no rank is left
//    waiting in a collective.
// Torch-free.
#pragma once
#include <csignal>
#include <vector>

namespace fp8tron {

class ExitSignalHandler {
 public:
  // Installs the handler for `signals`; the destructor puts the previous ones back. One at a time
  // per process. `save`: whether leaving saves a checkpoint first.
  ExitSignalHandler(std::vector<int> signals, bool save);
  ExitSignalHandler(const ExitSignalHandler&) = delete;
  ExitSignalHandler& operator=(const ExitSignalHandler&) = delete;
  ~ExitSignalHandler();

  // Whether this process received one of the signals since the handler was installed.
  bool received() const;
  bool saves() const { return save_; }

 private:
  std::vector<int> signals_;
  bool save_;
  std::vector<struct sigaction> previous_;
};

}  // namespace fp8tron
