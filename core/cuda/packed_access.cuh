// Packed memory access for the models' element-wise CUDA kernels (SwiGLU, RoPE, the fused
// residual norm): V consecutive elements loaded and stored as one access, 16 bytes when
// V = 16 / sizeof(T) and the address is 16-byte aligned. CUDA code only.
#pragma once
#ifdef __CUDACC__
#include <cuda_runtime.h>

namespace fp8tron::kernels {

template <class T, int V>
struct alignas(sizeof(T) * V) Pack {
  T v[V];
};

template <class P>
__device__ __forceinline__ P load(const void* p) {
  return *reinterpret_cast<const P*>(p);
}

// 16-byte packs are stored through __stwb (an explicit st.global.v4): as a plain assignment nvcc
// split the SwiGLU backward kernel's second store (at dx + f) into element stores.
template <class P>
__device__ __forceinline__ void store(void* p, const P& v) {
  if constexpr (sizeof(P) == 16) {
    __stwb(reinterpret_cast<uint4*>(p), *reinterpret_cast<const uint4*>(&v));
  } else {
    *reinterpret_cast<P*>(p) = v;
  }
}

}  // namespace fp8tron::kernels
#endif
