// --deterministic-mode (Megatron's flag): the process environment bitwise-reproducible GPU
// training needs, as a pure function of the current environment (torch-free, so validation can
// check it before anything is allocated; trainer/determinism.h applies it with torch's switches).
//
//   CUBLAS_WORKSPACE_CONFIG  :4096:8 or :16:8 (cuBLAS's documented reproducible settings; torch
//                            refuses cuBLAS GEMMs in deterministic mode without one). Set to
//                            :4096:8 when unset; must precede the first cuBLAS handle.
//   NCCL_ALGO                one of Tree, Ring, CollnetDirect, CollnetChain, ^NVLS (the values
//                            Megatron's --deterministic-mode accepts: NVLS reduces in the switch,
//                            in no fixed order). Megatron asserts it is set; fp8tron sets Ring
//                            when it is unset. Must precede the first NCCL communicator.
//   FP8TRON_GEMM_AUTOTUNE    0: FP8 GEMMs take cuBLASLt's heuristic first choice instead of the
//                            fastest timed candidate, which can differ from run to run (fp8/gemm.h).
#pragma once
#include <functional>
#include <string>
#include <vector>

namespace fp8tron {

struct EnvSetting {
  std::string name, value;
  bool already_set = false;  // the environment had this value; nothing to change
};

using EnvLookup = std::function<const char*(const char* name)>;

// The settings above, given the current environment (`lookup` returns nullptr for unset). Throws
// UserError naming the variable and the accepted values when one is set to a value that defeats
// determinism.
std::vector<EnvSetting> deterministic_environment(const EnvLookup& lookup);

}  // namespace fp8tron
