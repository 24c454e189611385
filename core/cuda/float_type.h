// The floating-point element types the models' CUDA kernels take (cross entropy, rotary
// embedding, SwiGLU), torch-free so .cu files can include it. In CUDA code it also gives the
// conversions the kernels compute with: load as fp32, compute in fp32, round once on store.
// Tensor-side code maps a tensor's dtype with kernel_float_of() (models/kernel_float_of.h).
#pragma once

namespace fp8tron::kernels {

enum class FloatType : int { kFloat32 = 0, kBFloat16 = 1, kFloat16 = 2 };

}  // namespace fp8tron::kernels

#ifdef __CUDACC__
#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace fp8tron::kernels {

template <class T> __device__ __forceinline__ float to_float(T v);
template <> __device__ __forceinline__ float to_float(float v) { return v; }
template <> __device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
template <> __device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
template <class T> __device__ __forceinline__ T from_float(float v);
template <> __device__ __forceinline__ float from_float(float v) { return v; }
template <> __device__ __forceinline__ __nv_bfloat16 from_float(float v) { return __float2bfloat16(v); }
template <> __device__ __forceinline__ __half from_float(float v) { return __float2half(v); }

}  // namespace fp8tron::kernels
#endif
