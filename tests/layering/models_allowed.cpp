// Control probe: what models/ may include (tests/layering/CMakeLists.txt). Torch-free headers only,
// so the probe compiles in a second.
#include "core/config/model_config.h"
#include "fp8/recipe.h"
#include "parallel/topology.h"
