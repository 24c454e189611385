#include "core/version.h"

namespace fp8tron {

std::string fp8tron_version_line() {
  return std::string("fp8tron ") + fp8tron_version() + " (commit " + fp8tron_commit() + ")";
}

}  // namespace fp8tron
