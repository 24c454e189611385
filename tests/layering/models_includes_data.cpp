// Layering probe (tests/layering/CMakeLists.txt): models/ must not depend on data/, so this include must not compile.
#include "data/tokenizer.h"
