#include "trainer/exit_signal.h"

#include <cerrno>
#include <cstring>
#include <string>

#include "core/error.h"

namespace fp8tron {
namespace {
volatile std::sig_atomic_t g_received = 0;
volatile std::sig_atomic_t g_installed = 0;
extern "C" void on_exit_signal(int) { g_received = 1; }
}  // namespace

ExitSignalHandler::ExitSignalHandler(std::vector<int> signals, bool save) : signals_(std::move(signals)), save_(save) {
  FP8TRON_CHECK(!g_installed, "an exit signal handler is already installed");
  struct sigaction action {};
  action.sa_handler = on_exit_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;  // interrupted reads and waits resume; the loop checks the flag
  g_received = 0;
  for (int signal : signals_) {
    struct sigaction previous {};
    if (sigaction(signal, &action, &previous) != 0) {
      const std::string why = std::strerror(errno);
      for (size_t i = 0; i < previous_.size(); ++i) sigaction(signals_[i], &previous_[i], nullptr);
      throw UserError("cannot install the exit signal handler: " + why);
    }
    previous_.push_back(previous);
  }
  g_installed = 1;
}

ExitSignalHandler::~ExitSignalHandler() {
  for (size_t i = 0; i < previous_.size(); ++i) sigaction(signals_[i], &previous_[i], nullptr);
  g_installed = 0;
}

bool ExitSignalHandler::received() const { return g_received != 0; }

}  // namespace fp8tron
