#include "trainer/profiling.h"

#include <cuda_profiler_api.h>
#include <torch/csrc/autograd/profiler_kineto.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>

#include "core/error.h"
#include "core/log.h"
#include "core/text.h"

namespace fp8tron {
namespace kineto = torch::autograd::profiler;
using torch::profiler::impl::ActivityType;

StepProfiler::StepProfiler(const ProfilingConfig& config, int rank, std::string trace_dir, bool cuda)
    : config_(config), trace_dir_(std::move(trace_dir)), cuda_(cuda) {
  active_rank_ = config.enabled && std::find(config.ranks.begin(), config.ranks.end(), rank) != config.ranks.end();
  if (active_rank_ && config.pytorch_profiler) {
    // Kineto's CUPTI setup takes a while: done here, not inside the profiled window.
    kineto::prepareProfiler(torch::profiler::impl::ProfilerConfig(torch::profiler::impl::ProfilerState::KINETO,
                                                                  config.record_shapes),
                            cuda ? std::set<ActivityType>{ActivityType::CPU, ActivityType::CUDA}
                                 : std::set<ActivityType>{ActivityType::CPU});
  }
}

StepProfiler::~StepProfiler() {
  try {
    finish();
  } catch (const std::exception& e) {
    log::warning(std::string("the profile could not be written: ") + e.what());
  }
}

void StepProfiler::before_iteration(int64_t iteration, const std::function<void()>& synchronize) {
  if (!active_rank_) return;
  const int64_t completed = iteration - 1;  // Megatron's iteration counter at the top of its loop
  if (completed == config_.step_start && !running_) {
    synchronize();
    start();
  } else if (completed == config_.step_end && running_) {
    synchronize();
    stop();
  }
}

void StepProfiler::finish() {
  if (running_) stop();
}

void StepProfiler::start() {
  running_ = true;
  if (!config_.pytorch_profiler) {
    if (cuda_) cudaProfilerStart();
    log::info(strprintf(" > profiling iterations %lld to %lld (Nsight Systems capture range)",
                        (long long)config_.step_start + 1, (long long)config_.step_end));
    return;
  }
  kineto::enableProfiler(torch::profiler::impl::ProfilerConfig(torch::profiler::impl::ProfilerState::KINETO,
                                                               config_.record_shapes),
                         cuda_ ? std::set<ActivityType>{ActivityType::CPU, ActivityType::CUDA}
                               : std::set<ActivityType>{ActivityType::CPU});
  log::info(strprintf(" > profiling iterations %lld to %lld with the PyTorch profiler", (long long)config_.step_start + 1,
                      (long long)config_.step_end));
}

void StepProfiler::stop() {
  running_ = false;
  if (!config_.pytorch_profiler) {
    if (cuda_) cudaProfilerStop();
    return;
  }
  auto result = kineto::disableProfiler();
  std::filesystem::create_directories(trace_dir_);
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                      std::chrono::system_clock::now().time_since_epoch()).count();
  const std::string path = strprintf("%s/%s_%d.%lld.pt.trace.json", trace_dir_.c_str(), host, int(getpid()), (long long)ms);
  result->save(path);
  log::info(" > profile written to " + path);
}

}  // namespace fp8tron
