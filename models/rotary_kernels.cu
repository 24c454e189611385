// The fused rotary embedding: one pass over x, memory-bound (one read and one write per element).

#include "fp8/cuda_check.h"
#include "models/rotary_kernels.h"

namespace fp8tron::kernels {
namespace {

// One block per token row (s, b): the cos/sin row is shared by all its heads. Each thread rotates
// whole pairs (both channels read once, both written), then the pass-through channels are copied.
// 32-bit index arithmetic within a row (heads x d fits easily).
template <class T>
__global__ void rotary_kernel(const T* __restrict__ x, T* __restrict__ out, RotaryShape sh, const float* __restrict__ cos,
                              const float* __restrict__ sin, float sin_sign) {
  const int64_t row = blockIdx.x;  // s * b + bi
  const int64_t si = row / sh.b, bi = row % sh.b;
  const int half = int(sh.dim / 2), d = int(sh.d), p = int(sh.p), heads = int(sh.g * sh.p);
  const T* xrow = x + si * sh.x_stride[0] + bi * sh.x_stride[1];
  T* orow = out + row * int64_t(heads) * d;
  const float* crow = cos + si * half;
  const float* srow = sin + si * half;
  for (int idx = threadIdx.x; idx < heads * half; idx += blockDim.x) {
    const int head = idx / half, i = idx - head * half;
    const T* xh = xrow + (head / p) * sh.x_stride[2] + (head % p) * sh.x_stride[3];
    const int c0 = sh.interleaved ? 2 * i : i, c1 = sh.interleaved ? 2 * i + 1 : i + half;
    const float x0 = to_float(xh[c0]), x1 = to_float(xh[c1]);
    const float cs = crow[i], sn = sin_sign * srow[i];
    // (x0, x1) -> (x0 cos - x1 sin, x1 cos + x0 sin)
    orow[head * d + c0] = from_float<T>(x0 * cs - x1 * sn);
    orow[head * d + c1] = from_float<T>(x1 * cs + x0 * sn);
  }
  const int rest = d - int(sh.dim);
  for (int idx = threadIdx.x; idx < heads * rest; idx += blockDim.x) {
    const int head = idx / rest, c = int(sh.dim) + idx - head * rest;
    orow[head * d + c] = xrow[(head / p) * sh.x_stride[2] + (head % p) * sh.x_stride[3] + c];
  }
}

template <class T>
void launch(const void* x, void* out, const RotaryShape& sh, const float* cos, const float* sin, float sin_sign,
            cudaStream_t stream) {
  const int64_t rows = sh.s * sh.b;
  if (rows == 0 || sh.g * sh.p * sh.d == 0) return;
  const int64_t pairs = sh.g * sh.p * (sh.dim / 2);
  const int threads = pairs >= 512 ? 512 : pairs >= 256 ? 256 : 128;
  rotary_kernel<T><<<unsigned(rows), threads, 0, stream>>>(static_cast<const T*>(x), static_cast<T*>(out), sh, cos, sin,
                                                           sin_sign);
  FP8TRON_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void rotary_apply(const void* x, void* out, FloatType dtype, const RotaryShape& shape, const float* cos,
                  const float* sin, float sin_sign, cudaStream_t stream) {
  switch (dtype) {
    case FloatType::kFloat32: return launch<float>(x, out, shape, cos, sin, sin_sign, stream);
    case FloatType::kBFloat16: return launch<__nv_bfloat16>(x, out, shape, cos, sin, sin_sign, stream);
    case FloatType::kFloat16: return launch<__half>(x, out, shape, cos, sin, sin_sign, stream);
  }
}

}  // namespace fp8tron::kernels
