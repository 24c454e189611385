// Layering probe (tests/layering/CMakeLists.txt): data/ must not depend on models/, so this include must not compile.
#include "models/gpt_model.h"
