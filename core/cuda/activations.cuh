// The activations' math in fp32 for device code, in one place for every kernel that fuses one:
// GeLU (tanh approximation) and SiLU, their derivatives, and fast variants. CUDA code only.
#pragma once
#ifdef __CUDACC__
#include <cuda_runtime.h>

namespace fp8tron::kernels {

// GeLU, tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
constexpr float kGeluBeta = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluKappa = 0.044715f;

// torch's gelu(x, approximate="tanh") and gelu_backward in fp32, as its kernels compute them (the
// compiler may fuse multiply-adds), for the FP8 casts that fuse the activation (fp8/quantize_tile.cuh).
__device__ __forceinline__ float gelu_tanh(float x) {
  const float x_cube = x * x * x;
  const float inner = kGeluBeta * (x + kGeluKappa * x_cube);
  return 0.5f * x * (1.0f + tanhf(inner));
}
__device__ __forceinline__ float gelu_tanh_backward(float dy, float x) {
  const float x_sq = x * x;
  const float x_cube = x_sq * x;
  const float inner = kGeluBeta * (x + kGeluKappa * x_cube);
  const float tanh_inner = tanhf(inner);
  const float left = 0.5f * x;
  const float right = 1.0f + tanh_inner;
  const float left_derivative = 0.5f * right;
  const float right_derivative =
      left * (1.0f - tanh_inner * tanh_inner) * kGeluBeta * (1.0f + 3.0f * kGeluKappa * x_sq);
  return dy * (left_derivative + right_derivative);
}

// The same split at t = tanh(...) with every operation of t rounded on its own (no fused
// multiply-adds), for kernels whose backward recomputes the forward's t and must get its bits
// (models/mlp/gelu_kernels.cu): gelu = gelu_from_tanh(x, gelu_tanh_inner(x)).
__device__ __forceinline__ float gelu_tanh_inner(float x) {
  const float cube = __fmul_rn(__fmul_rn(x, x), x);
  return tanhf(__fmul_rn(kGeluBeta, __fadd_rn(x, __fmul_rn(kGeluKappa, cube))));
}
__device__ __forceinline__ float gelu_from_tanh(float x, float t) { return __fmul_rn(__fmul_rn(0.5f, x), __fadd_rn(1.0f, t)); }
// d gelu / dx: 0.5 (1 + t) + 0.5 x (1 - t^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2), torch's terms.
__device__ __forceinline__ float gelu_derivative_from_tanh(float x, float t) {
  const float left_derivative = 0.5f * (1.0f + t);
  const float inner_derivative = kGeluBeta * (1.0f + 3.0f * kGeluKappa * x * x);
  return left_derivative + 0.5f * x * (1.0f - t * t) * inner_derivative;
}

// SiLU and its derivative: torch's formulas (opmath fp32), which the fused SwiGLU kernels use
// (models/mlp/swiglu_kernels.cu), and fast approximations, which the FP8 casts that fuse SwiGLU use
// (fp8/quantize_tile.cuh).

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

}  // namespace fp8tron::kernels
#endif
