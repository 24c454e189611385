// Delayed-scaling update on the device (update_delayed_scaling_cuda, declared in scaling_state.h):
// the same rule as update_delayed_scaling_cpu, one thread per slot. The [history_len][num_slots]
// layout makes every history row a coalesced read across the threads of a warp.
#include <cuda_runtime.h>

#include "core/error.h"
#include "core/cuda/cuda_check.h"
#include "fp8/scale_math.h"
#include "fp8/scaling_state.h"

namespace fp8tron::fp8 {

namespace {

__global__ void delayed_update_kernel(ScalingBuffers b, DelayedUpdateParams p) {
  const size_t s = p.slot_begin + static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (s >= p.slot_end) return;
  update_delayed_slot(b, p, s);
}

}  // namespace

void update_delayed_scaling_cuda(const ScalingBuffers& buffers, const DelayedUpdateParams& params,
                                 CUstream_st* stream) {
  FP8TRON_CHECK(params.slot_end <= buffers.num_slots && params.slot_begin <= params.slot_end,
                "slot range out of bounds");
  FP8TRON_CHECK(buffers.history_len >= 1, "empty amax history");
  const size_t count = params.slot_end - params.slot_begin;
  if (count == 0) return;
  constexpr unsigned kThreads = 128;
  const auto blocks = static_cast<unsigned>((count + kThreads - 1) / kThreads);
  delayed_update_kernel<<<blocks, kThreads, 0, stream>>>(buffers, params);
  FP8TRON_CUDA_CHECK_LAUNCH("delayed_update_kernel");
}

}  // namespace fp8tron::fp8
