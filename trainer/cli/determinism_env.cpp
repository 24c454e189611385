#include "trainer/cli/determinism_env.h"

#include <algorithm>

#include "core/error.h"
#include "core/text.h"

namespace fp8tron {
namespace {

EnvSetting choose(const EnvLookup& lookup, const char* name, const std::vector<std::string>& accepted,
                  const std::string& fallback, const char* why) {
  const char* current = lookup(name);
  if (!current || !*current) return {name, fallback, false};
  if (std::find(accepted.begin(), accepted.end(), current) != accepted.end()) return {name, current, true};
  throw UserError(strprintf("--deterministic-mode: %s=%s %s; set it to one of %s or leave it unset (fp8tron then "
                            "uses %s)",
                            name, current, why, join(accepted, ", ").c_str(), fallback.c_str()));
}

}  // namespace

std::vector<EnvSetting> deterministic_environment(const EnvLookup& lookup) {
  return {
      choose(lookup, "CUBLAS_WORKSPACE_CONFIG", {":4096:8", ":16:8"}, ":4096:8",
             "lets cuBLAS pick workspace-dependent kernels that are not reproducible"),
      choose(lookup, "NCCL_ALGO", {"Tree", "Ring", "CollnetDirect", "CollnetChain", "^NVLS"}, "Ring",
             "is not one of the NCCL algorithms Megatron's --deterministic-mode accepts"),
      choose(lookup, "FP8TRON_GEMM_AUTOTUNE", {"0"}, "0",
             "times GEMM candidates at run time, so the kernel (and its rounding) can differ between runs"),
  };
}

}  // namespace fp8tron
