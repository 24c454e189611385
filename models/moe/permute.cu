// CUDA kernels behind permute_kernels.h. One thread block per row (gather, chunk sort) or per
// token (combine, probability gradients), threads striding over the hidden dimension; copies move
// 16 bytes per thread step when rows and pointers allow it. A token's routed experts are
// compacted into shared memory in ascending expert order by warp 0 (ballots), so the sums run in
// the order of the CPU path.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "core/error.h"
#include "fp8/cuda_check.h"
#include "models/moe/permute_kernels.h"

namespace fp8tron::moe::kernels {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxBlocks = 65535 * 8;

__device__ __forceinline__ float load(const float* p, int64_t i) { return p[i]; }
__device__ __forceinline__ float load(const __nv_bfloat16* p, int64_t i) { return __bfloat162float(p[i]); }
__device__ __forceinline__ float load(const __half* p, int64_t i) { return __half2float(p[i]); }
__device__ __forceinline__ void store(float* p, int64_t i, float v) { p[i] = v; }
__device__ __forceinline__ void store(__nv_bfloat16* p, int64_t i, float v) { p[i] = __float2bfloat16_rn(v); }
__device__ __forceinline__ void store(__half* p, int64_t i, float v) { p[i] = __float2half_rn(v); }

size_t element_size(DType d) { return d == DType::kF32 ? 4 : 2; }
int blocks_for(int64_t n) { return int(std::max<int64_t>(1, std::min<int64_t>(n, kMaxBlocks))); }
bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

// ---- row copies ---------------------------------------------------------------------------------------
// Copies `bytes` (a multiple of 16 when `vec`) from src to dst with the block's threads.
__device__ __forceinline__ void copy_row(const char* src, char* dst, int64_t bytes, bool vec) {
  if (vec) {
    const auto* s = reinterpret_cast<const uint4*>(src);
    auto* d = reinterpret_cast<uint4*>(dst);
    for (int64_t i = threadIdx.x; i < bytes / 16; i += blockDim.x) d[i] = s[i];
  } else {
    for (int64_t i = threadIdx.x; i < bytes; i += blockDim.x) dst[i] = src[i];
  }
}

__global__ void gather_copy_kernel(const char* x, char* out, const int64_t* src_row, int64_t rows, int64_t row_bytes,
                                   bool vec) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) copy_row(x + src_row[r] * row_bytes, out + r * row_bytes, row_bytes, vec);
}

template <typename T>
__global__ void gather_scale_kernel(const T* x, T* out, const int64_t* src_row, const float* scale, int64_t rows,
                                    int64_t hidden) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t src = src_row[r] * hidden, dst = r * hidden;
    const float s = scale[r];
    for (int64_t h = threadIdx.x; h < hidden; h += blockDim.x) store(out, dst + h, __fmul_rn(load(x, src + h), s));
  }
}

__global__ void sort_chunks_kernel(const char* x, char* out, const int64_t* src_start, const int64_t* dst_start,
                                   int64_t chunks, int64_t rows, int64_t row_bytes, bool vec) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    // The last chunk starting at or before r (empty chunks share a start: any of them works).
    int64_t lo = 0, hi = chunks - 1;
    while (lo < hi) {
      const int64_t mid = (lo + hi + 1) / 2;
      if (dst_start[mid] <= r) lo = mid;
      else hi = mid - 1;
    }
    const int64_t src = src_start[lo] + (r - dst_start[lo]);
    copy_row(x + src * row_bytes, out + r * row_bytes, row_bytes, vec);
  }
}

// ---- per-token sums over the routed experts ------------------------------------------------------------
// Warp 0 lists token t's routed (row, prob) pairs in ascending expert order; returns how many.
__device__ int compact_routes(const int32_t* row_of, const float* probs, int64_t t, int64_t experts, int32_t* rows_out,
                              float* probs_out) {
  __shared__ int count;
  if (threadIdx.x < 32) {
    int n = 0;
    const unsigned lane = threadIdx.x;
    for (int64_t base = 0; base < experts; base += 32) {
      const int64_t e = base + lane;
      const int32_t row = e < experts ? row_of[t * experts + e] : -1;
      const unsigned routed = __ballot_sync(0xffffffffu, row >= 0);
      if (row >= 0) {
        const int at = n + __popc(routed & ((1u << lane) - 1u));
        rows_out[at] = row;
        if (probs_out) probs_out[at] = probs ? probs[t * experts + e] : 1.0f;
      }
      n += __popc(routed);
    }
    if (lane == 0) count = n;
  }
  __syncthreads();
  const int n = count;
  __syncthreads();  // `count` is reused by the next token
  return n;
}

template <typename In, typename Out>
__global__ void combine_kernel(const In* y, const int32_t* row_of, const float* probs, Out* out, int64_t tokens,
                               int64_t experts, int64_t hidden) {
  extern __shared__ unsigned char shared[];
  auto* rows = reinterpret_cast<int32_t*>(shared);
  auto* weights = reinterpret_cast<float*>(rows + experts);
  for (int64_t t = blockIdx.x; t < tokens; t += gridDim.x) {
    const int n = compact_routes(row_of, probs, t, experts, rows, weights);
    for (int64_t h = threadIdx.x; h < hidden; h += blockDim.x) {
      float acc = 0.0f;
      for (int i = 0; i < n; ++i) {
        const float v = load(y, int64_t(rows[i]) * hidden + h);
        acc = __fadd_rn(acc, probs ? __fmul_rn(weights[i], v) : v);
      }
      store(out, t * hidden + h, acc);
    }
    __syncthreads();
  }
}

template <typename T>
__global__ void prob_grad_kernel(const T* y, const T* dout, const int32_t* row_of, float* dprobs, int64_t tokens,
                                 int64_t experts, int64_t hidden) {
  __shared__ float partial[kThreads / 32];
  for (int64_t t = blockIdx.x; t < tokens; t += gridDim.x) {
    // The experts' indices are needed too: walk row_of directly.
    for (int64_t e = 0; e < experts; ++e) {
      const int32_t row = row_of[t * experts + e];
      if (row < 0) continue;
      float acc = 0.0f;
      for (int64_t h = threadIdx.x; h < hidden; h += blockDim.x)
        acc = __fadd_rn(acc, __fmul_rn(load(y, int64_t(row) * hidden + h), load(dout, t * hidden + h)));
      for (int offset = 16; offset > 0; offset /= 2) acc += __shfl_down_sync(0xffffffffu, acc, offset);
      if ((threadIdx.x & 31) == 0) partial[threadIdx.x / 32] = acc;
      __syncthreads();
      if (threadIdx.x == 0) {
        float sum = 0.0f;
        for (int w = 0; w < kThreads / 32; ++w) sum += partial[w];
        dprobs[t * experts + e] = sum;
      }
      __syncthreads();
    }
  }
}

template <typename F>
void by_dtype(DType d, F&& f) {
  switch (d) {
    case DType::kF32: f(float{}); break;
    case DType::kBF16: f(__nv_bfloat16{}); break;
    case DType::kF16: f(__half{}); break;
  }
}

size_t route_shared_bytes(int64_t experts) { return size_t(experts) * (sizeof(int32_t) + sizeof(float)); }

}  // namespace

void gather_rows(const void* x, void* out, DType dtype, const int64_t* src_row, const float* row_scale, int64_t rows,
                 int64_t hidden, cudaStream_t stream) {
  if (rows == 0 || hidden == 0) return;
  if (!row_scale) {
    const int64_t row_bytes = hidden * int64_t(element_size(dtype));
    const bool vec = row_bytes % 16 == 0 && aligned16(x) && aligned16(out);
    gather_copy_kernel<<<blocks_for(rows), kThreads, 0, stream>>>(static_cast<const char*>(x), static_cast<char*>(out),
                                                                   src_row, rows, row_bytes, vec);
    FP8TRON_CUDA_CHECK_LAUNCH("moe gather_copy_kernel");
    return;
  }
  by_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    gather_scale_kernel<T><<<blocks_for(rows), kThreads, 0, stream>>>(static_cast<const T*>(x), static_cast<T*>(out), src_row,
                                                                      row_scale, rows, hidden);
  });
  FP8TRON_CUDA_CHECK_LAUNCH("moe gather_scale_kernel");
}

void combine_rows(const void* y, DType y_dtype, const int32_t* row_of, const float* probs, void* out, DType out_dtype,
                  int64_t tokens, int64_t experts, int64_t hidden, cudaStream_t stream) {
  if (tokens == 0 || hidden == 0) return;
  FP8TRON_CHECK(out_dtype == y_dtype || out_dtype == DType::kF32, "combine_rows: output in the input's dtype or fp32");
  const size_t shared = route_shared_bytes(experts);
  FP8TRON_CHECK(shared <= 48 * 1024, "combine_rows: too many experts for one block's shared memory");
  by_dtype(y_dtype, [&](auto tag) {
    using In = decltype(tag);
    if (out_dtype == DType::kF32)
      combine_kernel<In, float><<<blocks_for(tokens), kThreads, shared, stream>>>(
          static_cast<const In*>(y), row_of, probs, static_cast<float*>(out), tokens, experts, hidden);
    else
      combine_kernel<In, In><<<blocks_for(tokens), kThreads, shared, stream>>>(
          static_cast<const In*>(y), row_of, probs, static_cast<In*>(out), tokens, experts, hidden);
  });
  FP8TRON_CUDA_CHECK_LAUNCH("moe combine_kernel");
}

void prob_grads(const void* y, const void* dout, DType dtype, const int32_t* row_of, float* dprobs, int64_t tokens,
                int64_t experts, int64_t hidden, cudaStream_t stream) {
  FP8TRON_CUDA_CHECK(cudaMemsetAsync(dprobs, 0, size_t(tokens * experts) * sizeof(float), stream));
  if (tokens == 0 || hidden == 0) return;
  by_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    prob_grad_kernel<T><<<blocks_for(tokens), kThreads, 0, stream>>>(static_cast<const T*>(y), static_cast<const T*>(dout),
                                                                     row_of, dprobs, tokens, experts, hidden);
  });
  FP8TRON_CUDA_CHECK_LAUNCH("moe prob_grad_kernel");
}

void sort_chunks(const void* x, void* out, DType dtype, const int64_t* src_start, const int64_t* dst_start, int64_t chunks,
                 int64_t rows, int64_t hidden, cudaStream_t stream) {
  if (rows == 0 || hidden == 0 || chunks == 0) return;
  const int64_t row_bytes = hidden * int64_t(element_size(dtype));
  const bool vec = row_bytes % 16 == 0 && aligned16(x) && aligned16(out);
  sort_chunks_kernel<<<blocks_for(rows), kThreads, 0, stream>>>(static_cast<const char*>(x), static_cast<char*>(out),
                                                                 src_start, dst_start, chunks, rows, row_bytes, vec);
  FP8TRON_CUDA_CHECK_LAUNCH("moe sort_chunks_kernel");
}

}  // namespace fp8tron::moe::kernels
