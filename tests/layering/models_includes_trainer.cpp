// Layering probe (tests/layering/CMakeLists.txt): models/ (the model layer) must not depend on the CLI, so this include must not compile.
#include "trainer/cli/flags.h"
