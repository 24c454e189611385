#include "trainer/exit_signal.h"

#include <cerrno>
#include <cstring>

#include "core/error.h"

namespace fp8tron {
namespace {
volatile std::sig_atomic_t g_received = 0;
volatile std::sig_atomic_t g_installed = 0;
extern "C" void on_exit_signal(int) { g_received = 1; }
}  // namespace

ExitSignalHandler::ExitSignalHandler(int signal) : signal_(signal) {
  FP8TRON_CHECK(!g_installed, "an exit signal handler is already installed");
  struct sigaction action {};
  action.sa_handler = on_exit_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;  // interrupted reads and waits resume; the loop checks the flag
  g_received = 0;
  if (sigaction(signal_, &action, &previous_) != 0)
    throw UserError(std::string("cannot install the exit signal handler: ") + std::strerror(errno));
  g_installed = 1;
}

ExitSignalHandler::~ExitSignalHandler() {
  sigaction(signal_, &previous_, nullptr);
  g_installed = 0;
}

bool ExitSignalHandler::received() const { return g_received != 0; }

}  // namespace fp8tron
