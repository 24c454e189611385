#include "checkpoint/snapshot_buffers.h"

#include <chrono>

#include "core/log.h"
#include "checkpoint/host_buffer.h"

namespace fp8tron {

SnapshotBuffers::~SnapshotBuffers() {
  if (reserving.joinable()) reserving.join();
}

double SnapshotBuffers::take_reserved() {
  if (!reserving.joinable()) return -1;
  const auto start = std::chrono::steady_clock::now();
  reserving.join();
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  stats->reserve_seconds = reserve_seconds;
  if (!reserve_error.empty()) {
    log::warning("the host memory for asynchronous checkpoint saves could not be reserved at start-up (" +
                 reserve_error + "); trying again now");
  } else {
    buffers = std::move(reserved);
  }
  return waited;
}

torch::Tensor SnapshotBuffers::get(size_t index, int64_t numel, torch::ScalarType dtype, int pin_for_device) {
  if (index >= buffers.size()) buffers.resize(index + 1);
  torch::Tensor& b = buffers[index];
  if (!b.defined() || b.numel() != numel || b.scalar_type() != dtype) {
    b = torch::Tensor();  // release the old one first
    b = allocate_host_tensor(numel, dtype, pin_for_device);
    if (numel > 0) ++stats->buffers_allocated_by_saves;
  }
  return b;
}

}  // namespace fp8tron
