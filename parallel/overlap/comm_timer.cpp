#include "parallel/overlap/comm_timer.h"

#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <cuda_runtime_api.h>

#include <chrono>
#include <vector>

namespace fp8tron::overlap {

struct CommTimer::Impl {
  bool cuda = false;
  double host_ms = 0;
  // Pairs recorded this step; the pool keeps their events for the next steps.
  std::vector<std::pair<at::cuda::CUDAEvent, at::cuda::CUDAEvent>> pool;
  size_t used = 0;
};

CommTimer::CommTimer(bool cuda) : impl_(std::make_unique<Impl>()) { impl_->cuda = cuda; }
CommTimer::~CommTimer() = default;

void CommTimer::wait(CommWork& work) {
  if (!impl_->cuda) {
    const auto start = std::chrono::steady_clock::now();
    work.wait();
    impl_->host_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    return;
  }
  if (impl_->used == impl_->pool.size()) impl_->pool.emplace_back(at::cuda::CUDAEvent(cudaEventDefault), at::cuda::CUDAEvent(cudaEventDefault));
  auto& [before, after] = impl_->pool[impl_->used++];
  auto stream = at::cuda::getCurrentCUDAStream();
  before.record(stream);
  work.wait();
  after.record(stream);
}

double CommTimer::take_ms() {
  double ms = impl_->host_ms;
  for (size_t i = 0; i < impl_->used; ++i) ms += impl_->pool[i].first.elapsed_time(impl_->pool[i].second);
  impl_->host_ms = 0;
  impl_->used = 0;
  return ms;
}

}  // namespace fp8tron::overlap
