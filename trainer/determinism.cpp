#include "trainer/determinism.h"

#include <ATen/Context.h>

#include <cstdlib>

#include "core/error.h"
#include "core/log.h"
#include "core/text.h"
#include "trainer/cli/determinism_env.h"

namespace fp8tron {

DeterministicMode::DeterministicMode(const torch::Device& device) {
  auto& ctx = at::globalContext();
  algorithms_ = ctx.deterministicAlgorithms();
  warn_only_ = ctx.deterministicAlgorithmsWarnOnly();
  cudnn_deterministic_ = ctx.deterministicCuDNN();
  cudnn_benchmark_ = ctx.benchmarkCuDNN();
  sdp_cudnn_ = ctx.userEnabledCuDNNSDP();

  std::string changes = "torch deterministic algorithms on (an operation without a deterministic implementation is "
                        "an error); cuDNN deterministic, no benchmarking";
  if (device.is_cuda()) {
    // Validation checked these already; a variable changed since then still fails here, clearly.
    for (const EnvSetting& e : deterministic_environment([](const char* name) { return std::getenv(name); })) {
      if (!e.already_set && setenv(e.name.c_str(), e.value.c_str(), 1) != 0)
        throw UserError("--deterministic-mode: cannot set " + e.name + " in the environment");
      changes += "; " + e.name + "=" + e.value + (e.already_set ? " (as given)" : " (set)");
    }
    ctx.setSDPUseCuDNN(false);
    changes += "; cuDNN fused attention off (no deterministic backward), flash or memory-efficient attention with "
               "their deterministic backward instead";
  }
  ctx.setDeterministicAlgorithms(true, /*warn_only=*/false);
  ctx.setDeterministicCuDNN(true);
  ctx.setBenchmarkCuDNN(false);
  log::info(" > deterministic mode: " + changes);
}

DeterministicMode::~DeterministicMode() {
  auto& ctx = at::globalContext();
  ctx.setDeterministicAlgorithms(algorithms_, warn_only_);
  ctx.setDeterministicCuDNN(cudnn_deterministic_);
  ctx.setBenchmarkCuDNN(cudnn_benchmark_);
  ctx.setSDPUseCuDNN(sdp_cudnn_);
}

}  // namespace fp8tron
