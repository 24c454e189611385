// Reductions across the lanes of a warp by butterfly shuffles (xor offsets kLanes/2, ..., 2, 1):
// every lane of each group of kLanes consecutive lanes ends with the group's result, summed in the
// same order on every lane, so the result does not depend on which lane reads it. CUDA code only.
#pragma once
#ifdef __CUDACC__
#include <cuda_runtime.h>

namespace fp8tron::kernels {

constexpr unsigned kFullWarpMask = 0xffffffffu;

template <int kLanes = 32>
__device__ __forceinline__ float warp_sum(float v) {
  static_assert(kLanes > 0 && kLanes <= 32 && (kLanes & (kLanes - 1)) == 0, "a power of two up to 32 lanes");
#pragma unroll
  for (int offset = kLanes / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(kFullWarpMask, v, offset);
  return v;
}

template <int kLanes = 32>
__device__ __forceinline__ float warp_max(float v) {
  static_assert(kLanes > 0 && kLanes <= 32 && (kLanes & (kLanes - 1)) == 0, "a power of two up to 32 lanes");
#pragma unroll
  for (int offset = kLanes / 2; offset > 0; offset /= 2) v = fmaxf(v, __shfl_xor_sync(kFullWarpMask, v, offset));
  return v;
}

}  // namespace fp8tron::kernels
#endif
