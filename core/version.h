// What fp8tron binary this is: the release version (CMakeLists.txt's project version) and the git
// commit it was built from (`git describe --always --dirty`, read at build time). Printed by
// `fp8tron --version` and at the top of every log, and recorded in every checkpoint's metadata.
#pragma once
#include <string>

namespace fp8tron {

const char* fp8tron_version();
const char* fp8tron_commit();
// "fp8tron 0.1.0 (commit 1a2b3c4d5e6f)"
std::string fp8tron_version_line();

}  // namespace fp8tron
