// SiLU and its derivative in fp32 for device code: torch's formulas (opmath fp32), which the fused
// SwiGLU kernels use (models/swiglu_kernels.cu), and fast approximations, which the FP8 casts that
// fuse SwiGLU use (fp8/quantize.cu).
#pragma once
#include <cuda_runtime.h>

namespace fp8tron::fp8 {

// silu(g) = g / (1 + e^-g).
__device__ __forceinline__ float silu(float g) { return g / (1.0f + expf(-g)); }

// d silu(g) scaled by dy, evaluated as torch's silu_backward does: dy * s * (1 + g (1 - s)), left to
// right, from s = sigmoid(g).
__device__ __forceinline__ float silu_backward_from_sigmoid(float dy, float g, float s) {
  return dy * s * (1.0f + g * (1.0f - s));
}
// ... with torch's sigmoid(g) = 1 / (1 + e^-g).
__device__ __forceinline__ float silu_backward(float dy, float g) {
  return silu_backward_from_sigmoid(dy, g, 1.0f / (1.0f + expf(-g)));
}

// The same with the hardware's approximate exponential and reciprocal (ex2.approx, rcp.approx:
// a few ulp of fp32), for the FP8 casts that fuse SwiGLU: torch's exact formulas leave those casts
// compute-bound (IEEE division and expf per element). After the bf16 rounding the results differ
// from the exact ones by at most one bf16 step, in a small fraction of the elements, which the
// 8-bit cast that follows mostly absorbs.
__device__ __forceinline__ float sigmoid_fast(float g) { return __fdividef(1.0f, 1.0f + __expf(-g)); }
__device__ __forceinline__ float silu_fast(float g) { return g * sigmoid_fast(g); }

}  // namespace fp8tron::fp8
