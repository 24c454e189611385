// Megatron's --profile: iterations [--profile-step-start, --profile-step-end) (counted from 0, as
// Megatron counts them) of the ranks in --profile-ranks are profiled, either as an Nsight Systems
// capture range (cudaProfilerStart/Stop: run under `nsys profile --capture-range=cudaProfilerApi`)
// or, with --use-pytorch-profiler, by the PyTorch (Kineto) profiler, whose Chrome trace goes to
// --tensorboard-dir as Megatron's tensorboard_trace_handler names it (<host>_<pid>.<ms>.pt.trace.json).
// scripts/profile_summary.py turns such a trace into a per-kernel breakdown of the step.
#pragma once
#include <cstdint>
#include <functional>
#include <string>

#include "core/config/logging_config.h"

namespace fp8tron {

class StepProfiler {
 public:
  StepProfiler(const ProfilingConfig& config, int rank, std::string trace_dir, bool cuda);
  ~StepProfiler();
  StepProfiler(const StepProfiler&) = delete;
  StepProfiler& operator=(const StepProfiler&) = delete;

  // Call before iteration `iteration` (1-based, as the log counts) runs; `synchronize` waits for
  // the device so the window holds exactly the profiled iterations.
  void before_iteration(int64_t iteration, const std::function<void()>& synchronize);
  // Ends an open window (training stopped early).
  void finish();

 private:
  void start();
  void stop();

  ProfilingConfig config_;
  bool active_rank_ = false;
  bool running_ = false;
  std::string trace_dir_;
  bool cuda_ = false;
};

}  // namespace fp8tron
