// Layering probe (tests/layering/CMakeLists.txt): parallel/ knows nothing of FP8, so this include must not compile.
#include "fp8/recipe.h"
