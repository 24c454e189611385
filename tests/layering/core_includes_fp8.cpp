// Layering probe (tests/layering/CMakeLists.txt): core/ is below every other folder, so this include must not compile.
#include "fp8/recipe.h"
