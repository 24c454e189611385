// Layering probe (tests/layering/CMakeLists.txt): fp8/ knows nothing of process groups, so this include must not compile.
#include "parallel/topology.h"
