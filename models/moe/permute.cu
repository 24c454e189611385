// CUDA kernels behind permute_kernels.h (the index kernel is in permute_index.cu). One warp per
// row (gather) or per token (combine, probability gradients), lanes striding over the hidden
// dimension 16 bytes at a time when rows and pointers allow it; one block per row for the chunk
// sort. A token's routed experts are compacted by its warp (ballots) in ascending expert order, so
// the sums run in the order of the CPU path.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <initializer_list>
#include <type_traits>

#include "core/error.h"
#include "core/cuda/cuda_check.h"
#include "core/cuda/warp_reduce.cuh"
#include "models/moe/permute_kernels.h"

namespace fp8tron::moe::kernels {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxBlocks = 65535 * 8;

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
template <typename T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ float from_float<float>(float v) { return v; }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
template <>
__device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }

// N consecutive elements as fp32: one 16-byte load when N elements are 16 bytes (the caller
// checked the alignment), element loads otherwise.
template <typename T, int N>
__device__ __forceinline__ void load_n(const T* p, float (&out)[N]) {
  if constexpr (N * sizeof(T) == 16) {
    const uint4 raw = *reinterpret_cast<const uint4*>(p);
    const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
    for (int i = 0; i < N; ++i) out[i] = to_float(e[i]);
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) out[i] = to_float(p[i]);
  }
}

// Stores N fp32 values as T, 16 bytes at a time when N elements fill whole 16-byte words.
template <typename T, int N>
__device__ __forceinline__ void store_n(T* p, const float (&v)[N]) {
  if constexpr (N * sizeof(T) % 16 == 0) {
    constexpr int kPer = 16 / sizeof(T);
#pragma unroll
    for (int w = 0; w < N / kPer; ++w) {
      uint4 raw;
      T* e = reinterpret_cast<T*>(&raw);
#pragma unroll
      for (int i = 0; i < kPer; ++i) e[i] = from_float<T>(v[w * kPer + i]);
      reinterpret_cast<uint4*>(p)[w] = raw;
    }
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) p[i] = from_float<T>(v[i]);
  }
}

size_t element_size(DType d) { return d == DType::kF32 ? 4 : 2; }
int blocks_for(int64_t n) { return int(std::max<int64_t>(1, std::min<int64_t>(n, kMaxBlocks))); }
int warp_blocks_for(int64_t n) { return blocks_for((n + kWarps - 1) / kWarps); }
bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

// Whether rows of `hidden` elements of `bytes` each can move 16 bytes at a time from/to all of `ptrs`.
bool vectorizable(int64_t hidden, size_t bytes, std::initializer_list<const void*> ptrs) {
  if ((hidden * int64_t(bytes)) % 16 != 0) return false;
  for (const void* p : ptrs)
    if (!aligned16(p)) return false;
  return true;
}

// ---- row copies ---------------------------------------------------------------------------------------
// Copies `bytes` (a multiple of 16 when `vec`) from src to dst with the warp's lanes.
__device__ __forceinline__ void warp_copy_row(const char* src, char* dst, int64_t bytes, bool vec, int lane) {
  if (vec) {
    const auto* s = reinterpret_cast<const uint4*>(src);
    auto* d = reinterpret_cast<uint4*>(dst);
    for (int64_t i = lane; i < bytes / 16; i += 32) d[i] = s[i];
  } else {
    for (int64_t i = lane; i < bytes; i += 32) dst[i] = src[i];
  }
}

__global__ void gather_copy_kernel(const char* x, char* out, const int64_t* flat_of_row, int64_t experts, int64_t rows,
                                   int64_t row_bytes, bool vec) {
  const int lane = threadIdx.x % 32;
  for (int64_t r = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32; r < rows; r += int64_t(gridDim.x) * kWarps)
    warp_copy_row(x + (flat_of_row[r] / experts) * row_bytes, out + r * row_bytes, row_bytes, vec, lane);
}

template <typename T, int N>
__global__ void gather_scale_kernel(const T* x, T* out, const int64_t* flat_of_row, int64_t experts, const float* probs,
                                    int64_t rows, int64_t hidden) {
  const int lane = threadIdx.x % 32;
  for (int64_t r = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32; r < rows; r += int64_t(gridDim.x) * kWarps) {
    const int64_t flat = flat_of_row[r];
    const T* src = x + (flat / experts) * hidden;
    T* dst = out + r * hidden;
    const float s = probs[flat];
    for (int64_t h = int64_t(lane) * N; h < hidden; h += 32 * N) {
      float v[N];
      load_n<T, N>(src + h, v);
#pragma unroll
      for (int i = 0; i < N; ++i) v[i] = __fmul_rn(v[i], s);
      store_n<T, N>(dst + h, v);
    }
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
    const char* s = x + src * row_bytes;
    char* d = out + r * row_bytes;
    if (vec) {
      for (int64_t i = threadIdx.x; i < row_bytes / 16; i += blockDim.x)
        reinterpret_cast<uint4*>(d)[i] = reinterpret_cast<const uint4*>(s)[i];
    } else {
      for (int64_t i = threadIdx.x; i < row_bytes; i += blockDim.x) d[i] = s[i];
    }
  }
}

// ---- per-token sums over the routed experts ------------------------------------------------------------
// The warp lists token t's routed pairs in ascending expert order (row, expert) into its own
// shared-memory slots; returns how many. `unrouted_zero`, when given, gets 0 at the token's
// unrouted pairs.
__device__ int compact_routes(const int32_t* row_of, int64_t t, int64_t experts, int32_t* rows_out, int32_t* experts_out,
                              float* unrouted_zero, int lane) {
  int n = 0;
  for (int64_t base = 0; base < experts; base += 32) {
    const int64_t e = base + lane;
    const int32_t row = e < experts ? row_of[t * experts + e] : -1;
    const unsigned routed = __ballot_sync(0xffffffffu, row >= 0);
    if (row >= 0) {
      const int at = n + __popc(routed & ((1u << lane) - 1u));
      rows_out[at] = row;
      experts_out[at] = int32_t(e);
    } else if (unrouted_zero && e < experts) {
      unrouted_zero[t * experts + e] = 0.0f;
    }
    n += __popc(routed);
  }
  __syncwarp();
  return n;
}

template <typename In, typename Out, int N>
__global__ void combine_kernel(const In* y, const int32_t* row_of, const float* probs, Out* out, int64_t tokens,
                               int64_t experts, int64_t hidden) {
  extern __shared__ int32_t routes[];  // per warp: rows [experts], experts [experts]
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  int32_t* rows = routes + int64_t(warp) * 2 * experts;
  int32_t* ids = rows + experts;
  for (int64_t t = int64_t(blockIdx.x) * warps + warp; t < tokens; t += int64_t(gridDim.x) * warps) {
    const int n = compact_routes(row_of, t, experts, rows, ids, nullptr, lane);
    for (int64_t h = int64_t(lane) * N; h < hidden; h += 32 * N) {
      float acc[N];
#pragma unroll
      for (int j = 0; j < N; ++j) acc[j] = 0.0f;
      for (int i = 0; i < n; ++i) {
        float v[N];
        load_n<In, N>(y + int64_t(rows[i]) * hidden + h, v);
        const float p = probs ? probs[t * experts + ids[i]] : 1.0f;
#pragma unroll
        for (int j = 0; j < N; ++j) acc[j] = __fadd_rn(acc[j], probs ? __fmul_rn(p, v[j]) : v[j]);
      }
      store_n<Out, N>(out + t * hidden + h, acc);
    }
    __syncwarp();  // the slots are rewritten for the next token
  }
}

template <typename T, int N>
__global__ void prob_grad_kernel(const T* y, const T* dout, const int32_t* row_of, float* dprobs, int64_t tokens,
                                 int64_t experts, int64_t hidden) {
  extern __shared__ int32_t routes[];  // as combine_kernel's
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  int32_t* rows = routes + int64_t(warp) * 2 * experts;
  int32_t* ids = rows + experts;
  for (int64_t t = int64_t(blockIdx.x) * warps + warp; t < tokens; t += int64_t(gridDim.x) * warps) {
    const int n = compact_routes(row_of, t, experts, rows, ids, dprobs, lane);
    for (int i = 0; i < n; ++i) {
      float acc = 0.0f;
      for (int64_t h = int64_t(lane) * N; h < hidden; h += 32 * N) {
        float a[N], b[N];
        load_n<T, N>(y + int64_t(rows[i]) * hidden + h, a);
        load_n<T, N>(dout + t * hidden + h, b);
#pragma unroll
        for (int j = 0; j < N; ++j) acc = __fadd_rn(acc, __fmul_rn(a[j], b[j]));
      }
      acc = ::fp8tron::kernels::warp_sum(acc);
      if (lane == 0) dprobs[t * experts + ids[i]] = acc;
    }
    __syncwarp();
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

// The per-token kernels keep each warp's routes (a token's rows and expert ids) in shared memory:
// up to 8 warps per block, fewer when many experts would pass the 48 KiB of a block (one warp
// takes up to 6144 experts).
constexpr size_t kSharedBytes = 48 * 1024;
size_t route_bytes_per_warp(int64_t experts) { return size_t(experts) * 2 * sizeof(int32_t); }
int token_warps(int64_t experts) {
  return int(std::max<size_t>(1, std::min<size_t>(kWarps, kSharedBytes / std::max<size_t>(1, route_bytes_per_warp(experts)))));
}
int token_blocks(int64_t tokens, int warps) {
  return int(std::max<int64_t>(1, std::min<int64_t>((tokens + warps - 1) / warps, kMaxBlocks)));
}

// f(std::integral_constant<int, N>) with N the elements per 16 bytes when `vec`, else 1.
template <typename T, typename F>
void by_width(bool vec, F&& f) {
  if (vec) f(std::integral_constant<int, int(16 / sizeof(T))>{});
  else f(std::integral_constant<int, 1>{});
}

}  // namespace

void gather_rows(const void* x, void* out, DType dtype, const int64_t* flat_of_row, int64_t experts, const float* probs,
                 int64_t rows, int64_t hidden, cudaStream_t stream) {
  if (rows == 0 || hidden == 0) return;
  const size_t bytes = element_size(dtype);
  const bool vec = vectorizable(hidden, bytes, {x, out});
  if (!probs) {
    gather_copy_kernel<<<warp_blocks_for(rows), kThreads, 0, stream>>>(
        static_cast<const char*>(x), static_cast<char*>(out), flat_of_row, experts, rows, hidden * int64_t(bytes), vec);
    FP8TRON_CUDA_CHECK_LAUNCH("moe gather_copy_kernel");
    return;
  }
  by_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    by_width<T>(vec, [&](auto n) {
      gather_scale_kernel<T, decltype(n)::value><<<warp_blocks_for(rows), kThreads, 0, stream>>>(
          static_cast<const T*>(x), static_cast<T*>(out), flat_of_row, experts, probs, rows, hidden);
    });
  });
  FP8TRON_CUDA_CHECK_LAUNCH("moe gather_scale_kernel");
}

void combine_rows(const void* y, DType y_dtype, const int32_t* row_of, const float* probs, void* out, DType out_dtype,
                  int64_t tokens, int64_t experts, int64_t hidden, cudaStream_t stream) {
  if (tokens == 0 || hidden == 0) return;
  FP8TRON_CHECK(out_dtype == y_dtype || out_dtype == DType::kF32, "combine_rows: output in the input's dtype or fp32");
  FP8TRON_CHECK(route_bytes_per_warp(experts) <= kSharedBytes, "combine_rows: too many experts for a block's shared memory");
  const int warps = token_warps(experts);
  const size_t shared = size_t(warps) * route_bytes_per_warp(experts);
  // 16-byte steps of y's elements (the fp32 output of a 16-bit input then takes 32 bytes a step).
  const bool vec = vectorizable(hidden, element_size(y_dtype), {y, out});
  by_dtype(y_dtype, [&](auto tag) {
    using In = decltype(tag);
    by_width<In>(vec, [&](auto n) {
      constexpr int N = decltype(n)::value;
      if (out_dtype == DType::kF32)
        combine_kernel<In, float, N><<<token_blocks(tokens, warps), 32 * warps, shared, stream>>>(
            static_cast<const In*>(y), row_of, probs, static_cast<float*>(out), tokens, experts, hidden);
      else
        combine_kernel<In, In, N><<<token_blocks(tokens, warps), 32 * warps, shared, stream>>>(
            static_cast<const In*>(y), row_of, probs, static_cast<In*>(out), tokens, experts, hidden);
    });
  });
  FP8TRON_CUDA_CHECK_LAUNCH("moe combine_kernel");
}

void prob_grads(const void* y, const void* dout, DType dtype, const int32_t* row_of, float* dprobs, int64_t tokens,
                int64_t experts, int64_t hidden, cudaStream_t stream) {
  if (tokens == 0 || experts == 0) return;
  FP8TRON_CHECK(route_bytes_per_warp(experts) <= kSharedBytes, "prob_grads: too many experts for a block's shared memory");
  const int warps = token_warps(experts);
  const size_t shared = size_t(warps) * route_bytes_per_warp(experts);
  const bool vec = vectorizable(hidden, element_size(dtype), {y, dout});
  by_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    by_width<T>(vec, [&](auto n) {
      prob_grad_kernel<T, decltype(n)::value><<<token_blocks(tokens, warps), 32 * warps, shared, stream>>>(
          static_cast<const T*>(y), static_cast<const T*>(dout), row_of, dprobs, tokens, experts, hidden);
    });
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
