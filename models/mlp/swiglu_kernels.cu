// Fused SwiGLU kernels: element-wise, one grid-stride loop over [rows, f] in packs of V elements
// (16 bytes when every row start is 16-byte aligned, else one element). Each pack reads the gate
// and up values of the same columns. In [rows, f] tensors' worth of bytes, forward moves 3 and
// backward 5, against 5 and 13 for the unfused chain (silu, mul; mul's two gradients, silu_backward,
// and the cat that is chunk's backward).

#include <algorithm>

#include "core/cuda/cuda_check.h"
#include "core/cuda/activations.cuh"
#include "core/cuda/packed_access.cuh"
#include "models/mlp/swiglu_kernels.h"

namespace fp8tron::kernels {
namespace {

constexpr int kThreads = 256;
// Enough blocks to fill an H100 / H200 several times over; the loop strides over the rest.
constexpr int64_t kMaxBlocks = 8192;


// torch's silu and silu_backward formulas (core/cuda/activations.cuh), so fp32 results agree with the
// unfused chain to the last bits. (The FP8 casts that fuse SwiGLU use the fast variants there.)

// Pack i of the [rows, f / V] grid: its row and first column.
struct Position {
  int64_t row, col;
};
__device__ __forceinline__ Position position(int64_t i, int64_t packs_per_row, int V) {
  const int64_t row = i / packs_per_row;
  return {row, (i - row * packs_per_row) * V};
}

template <class T, int V>
__global__ void __launch_bounds__(kThreads) forward_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t rows,
                                                           int64_t f) {
  using P = Pack<T, V>;
  const int64_t packs_per_row = f / V, total = rows * packs_per_row;
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < total; i += int64_t(gridDim.x) * kThreads) {
    const Position p = position(i, packs_per_row, V);
    const T* gate = x + p.row * 2 * f + p.col;
    const P g = load<P>(gate);
    const P u = load<P>(gate + f);
    P out;
#pragma unroll
    for (int k = 0; k < V; ++k) out.v[k] = from_float<T>(silu(to_float(g.v[k])) * to_float(u.v[k]));
    store(y + p.row * f + p.col, out);
  }
}

template <class T, int V>
__global__ void __launch_bounds__(kThreads) backward_kernel(const T* __restrict__ dy, const T* __restrict__ x,
                                                            T* __restrict__ dx, T* __restrict__ y, int64_t rows,
                                                            int64_t f) {
  using P = Pack<T, V>;
  const int64_t packs_per_row = f / V, total = rows * packs_per_row;
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < total; i += int64_t(gridDim.x) * kThreads) {
    const Position p = position(i, packs_per_row, V);
    const int64_t in = p.row * 2 * f + p.col;
    const P g = load<P>(x + in);
    const P u = load<P>(x + in + f);
    const P d = load<P>(dy + p.row * f + p.col);
    P d_gate, d_up, out;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const float gk = to_float(g.v[k]), dk = to_float(d.v[k]), sk = silu(gk);
      // The unfused chain's order: (dy * up) first, then silu_backward of it.
      d_gate.v[k] = from_float<T>(silu_backward(dk * to_float(u.v[k]), gk));
      d_up.v[k] = from_float<T>(dk * sk);
      out.v[k] = from_float<T>(sk * to_float(u.v[k]));  // the forward's expression
    }
    store(dx + in, d_gate);
    store(dx + in + f, d_up);
    if (y != nullptr) store(y + p.row * f + p.col, out);
  }
}

template <class T> constexpr int kVector = 16 / sizeof(T);

// 16-byte packs need every row start aligned: f a multiple of the pack (rows of 2f and f elements
// then start on 16-byte boundaries) and 16-byte aligned base pointers.
template <class T>
bool can_vectorize(int64_t f, std::initializer_list<const void*> pointers) {
  bool ok = f % kVector<T> == 0;
  for (const void* p : pointers) ok = ok && reinterpret_cast<uintptr_t>(p) % 16 == 0;
  return ok;
}

unsigned blocks_for(int64_t packs) { return unsigned(std::min((packs + kThreads - 1) / kThreads, kMaxBlocks)); }

template <class T>
void launch_forward(const void* x, void* y, int64_t rows, int64_t f, cudaStream_t stream) {
  if (rows == 0 || f == 0) return;
  const auto* in = static_cast<const T*>(x);
  auto* out = static_cast<T*>(y);
  if (can_vectorize<T>(f, {x, y})) {
    constexpr int V = kVector<T>;
    forward_kernel<T, V><<<blocks_for(rows * (f / V)), kThreads, 0, stream>>>(in, out, rows, f);
  } else {
    forward_kernel<T, 1><<<blocks_for(rows * f), kThreads, 0, stream>>>(in, out, rows, f);
  }
  FP8TRON_CUDA_CHECK_LAUNCH("swiglu forward_kernel");
}

template <class T>
void launch_backward(const void* dy, const void* x, void* dx, void* y, int64_t rows, int64_t f, cudaStream_t stream) {
  if (rows == 0 || f == 0) return;
  const auto* d = static_cast<const T*>(dy);
  const auto* in = static_cast<const T*>(x);
  auto* out = static_cast<T*>(dx);
  auto* recomputed = static_cast<T*>(y);
  if (can_vectorize<T>(f, {dy, x, dx, y})) {
    constexpr int V = kVector<T>;
    backward_kernel<T, V><<<blocks_for(rows * (f / V)), kThreads, 0, stream>>>(d, in, out, recomputed, rows, f);
  } else {
    backward_kernel<T, 1><<<blocks_for(rows * f), kThreads, 0, stream>>>(d, in, out, recomputed, rows, f);
  }
  FP8TRON_CUDA_CHECK_LAUNCH("swiglu backward_kernel");
}

}  // namespace

void swiglu_forward(const void* x, void* y, FloatType dtype, int64_t rows, int64_t f, cudaStream_t stream) {
  switch (dtype) {
    case FloatType::kFloat32: return launch_forward<float>(x, y, rows, f, stream);
    case FloatType::kBFloat16: return launch_forward<__nv_bfloat16>(x, y, rows, f, stream);
    case FloatType::kFloat16: return launch_forward<__half>(x, y, rows, f, stream);
  }
}

void swiglu_backward(const void* dy, const void* x, void* dx, FloatType dtype, int64_t rows, int64_t f,
                     cudaStream_t stream, void* y) {
  switch (dtype) {
    case FloatType::kFloat32: return launch_backward<float>(dy, x, dx, y, rows, f, stream);
    case FloatType::kBFloat16: return launch_backward<__nv_bfloat16>(dy, x, dx, y, rows, f, stream);
    case FloatType::kFloat16: return launch_backward<__half>(dy, x, dx, y, rows, f, stream);
  }
}

}  // namespace fp8tron::kernels
