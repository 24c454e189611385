#include "checkpoint/host_buffer.h"

#include <cuda_runtime_api.h>
#include <sys/mman.h>

#include <algorithm>
#include <cstring>
#include <thread>
#include <vector>

#include "core/error.h"
#include "core/text.h"

namespace fp8tron {
namespace {

constexpr size_t kHugePage = size_t{2} << 20;

// Owns the mapping (and its CUDA registration); deleted with the tensor's storage.
struct HostBlock {
  void* data = nullptr;
  size_t bytes = 0;
  bool registered = false;
  ~HostBlock() {
    // Errors are ignored: at process exit the CUDA context may already be gone, and the
    // mapping goes with the process anyway.
    if (registered) (void)cudaHostUnregister(data);
    if (data) munmap(data, bytes);
  }
};

// Faults every page in (writing zeros) with a few threads: the kernel's page zeroing is the bulk
// of the cost and runs at a few GB/s per thread. Few threads: this usually runs beside training.
void populate(char* data, size_t bytes) {
  const size_t hw = std::max(1u, std::thread::hardware_concurrency());
  const size_t threads = std::clamp<size_t>(std::min(hw / 4, bytes / (size_t{256} << 20)), 1, 4);
  const size_t chunk = (bytes / threads + kHugePage - 1) / kHugePage * kHugePage;
  std::vector<std::thread> workers;
  for (size_t t = 1; t < threads; ++t) {
    const size_t begin = t * chunk;
    if (begin >= bytes) break;
    workers.emplace_back([=] { std::memset(data + begin, 0, std::min(chunk, bytes - begin)); });
  }
  std::memset(data, 0, std::min(chunk, bytes));
  for (auto& w : workers) w.join();
}

}  // namespace

torch::Tensor allocate_host_tensor(int64_t numel, torch::ScalarType dtype, int pin_for_device) {
  FP8TRON_CHECK(numel >= 0, "negative size");
  const auto options = torch::TensorOptions().dtype(dtype).device(torch::kCPU);
  if (numel == 0) return torch::empty({0}, options);
  const size_t bytes = size_t(numel) * c10::elementSize(dtype);
  const size_t mapped = (bytes + kHugePage - 1) / kHugePage * kHugePage;
  const double gb = double(bytes) / 1e9;
  void* data = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (data == MAP_FAILED)
    throw UserError(strprintf("cannot allocate %.2f GB of host memory for the checkpoint snapshot (--async-save): %s",
                              gb, std::strerror(errno)));
  auto block = std::make_unique<HostBlock>();
  block->data = data;
  block->bytes = mapped;
  (void)madvise(data, mapped, MADV_HUGEPAGE);  // fewer pages to fault and to pin; a hint only
  populate(static_cast<char*>(data), mapped);
  if (pin_for_device >= 0) {
    cudaError_t status = cudaSetDevice(pin_for_device);
    if (status == cudaSuccess) status = cudaHostRegister(data, mapped, cudaHostRegisterDefault);
    if (status != cudaSuccess) {
      (void)cudaGetLastError();  // clear it, so that no later CUDA call on this thread reports it
      throw UserError(strprintf("cannot pin %.2f GB of host memory for the checkpoint snapshot (--async-save): %s "
                                "(is the locked-memory limit, ulimit -l, too low?)",
                                gb, cudaGetErrorString(status)));
    }
    block->registered = true;
  }
  HostBlock* owner = block.release();
  return torch::from_blob(data, {numel}, [owner](void*) { delete owner; }, options);
}

}  // namespace fp8tron
