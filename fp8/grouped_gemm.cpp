#include "fp8/grouped_gemm.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>

#include "core/error.h"
#include "core/cuda/cuda_check.h"

namespace fp8tron::fp8 {

SideStreams::SideStreams(int count) {
  FP8TRON_CHECK(count >= 1, "SideStreams needs at least one stream");
  int lowest = 0, highest = 0;
  FP8TRON_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&lowest, &highest));
  for (int i = 0; i < count; ++i) {
    cudaStream_t s = nullptr;
    FP8TRON_CUDA_CHECK(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, highest));
    streams_.push_back(s);
    cudaEvent_t e = nullptr;
    FP8TRON_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    done_.push_back(e);
  }
  FP8TRON_CUDA_CHECK(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
}

SideStreams::~SideStreams() {
  for (cudaEvent_t e : done_) cudaEventDestroy(e);
  if (ready_) cudaEventDestroy(ready_);
  for (cudaStream_t s : streams_) cudaStreamDestroy(s);
}

FanOut::FanOut(SideStreams& pool, CUstream_st* main, size_t jobs) : pool_(pool), main_(main), lock_(pool.mutex_) {
  if (jobs <= 1) return;  // one job: the caller's stream, no fork
  load_.assign(std::min(jobs, pool.size()), 0.0);
  FP8TRON_CUDA_CHECK(cudaEventRecord(pool.ready_, main));
  for (size_t i = 0; i < load_.size(); ++i) FP8TRON_CUDA_CHECK(cudaStreamWaitEvent(pool.streams_[i], pool.ready_, 0));
}

FanOut::~FanOut() {
  // Joins even when a job threw: the caller's stream must not run ahead of enqueued GEMMs.
  for (size_t i = 0; i < load_.size(); ++i) {
    if (cudaEventRecord(pool_.done_[i], pool_.streams_[i]) != cudaSuccess ||
        cudaStreamWaitEvent(main_, pool_.done_[i], 0) != cudaSuccess) {
      (void)cudaGetLastError();
      cudaStreamSynchronize(pool_.streams_[i]);  // cannot order by events: wait on the host
    }
  }
}

CUstream_st* FanOut::stream_for(double work) {
  if (load_.empty()) return main_;
  const size_t i = size_t(std::min_element(load_.begin(), load_.end()) - load_.begin());
  load_[i] += std::max(work, 1.0);  // ties (and empty jobs) still rotate
  return pool_.streams_[i];
}

void grouped_gemm(GemmHandle& handle, SideStreams& pool, const std::vector<GroupedGemm>& gemms, CUstream_st* main) {
  FanOut fan(pool, main, gemms.size());
  for (const GroupedGemm& g : gemms) {
    const GemmProblem& p = g.problem;
    const double m = double(p.a.transposed ? p.a.cols : p.a.rows), k = double(p.a.transposed ? p.a.rows : p.a.cols);
    const double n = double(p.b.transposed ? p.b.rows : p.b.cols);
    gemm(handle, p.a, p.b, p.d, g.config, fan.stream_for(m * n * k));
  }
}

GroupedGemmResources::GroupedGemmResources() : handle([] {
  GemmHandleOptions o;
  o.algo_selection = AlgoSelection::kHeuristic;
  return o;
}()), streams(kGroupedGemmStreams) {}

GroupedGemmResources& grouped_gemm_resources() {
  constexpr int kMaxDevices = 64;
  static std::array<GroupedGemmResources*, kMaxDevices> resources{};
  static std::mutex mutex;
  int device = 0;
  FP8TRON_CUDA_CHECK(cudaGetDevice(&device));
  FP8TRON_CHECK(device >= 0 && device < kMaxDevices, "grouped GEMMs: device index out of range");
  std::lock_guard<std::mutex> lock(mutex);
  // Never destroyed: at exit the CUDA context may already be gone (torch's pools do the same).
  if (!resources[size_t(device)]) resources[size_t(device)] = new GroupedGemmResources();
  return *resources[size_t(device)];
}

}  // namespace fp8tron::fp8
