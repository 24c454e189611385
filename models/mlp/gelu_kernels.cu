// The fused GeLU MLP's kernels. In [rows, cols] tensors' worth of bytes the backward moves 4 (reads
// dL/dg and pre, writes dL/dpre and g) and sums fc1's bias gradient on the way; the chain it
// replaces moved 3 for gelu_backward plus 1 for cuBLASLt's separate bias-gradient kernel, and kept
// g saved from the forward (one [tokens, ffn] tensor per layer: 3.2 GB at GPT 1.3B).

#include <algorithm>

#include "core/cuda/cuda_check.h"
#include "models/mlp/gelu_kernels.h"
#include "core/cuda/float_type.h"
#include "core/cuda/activations.cuh"
#include "core/cuda/packed_access.cuh"

namespace fp8tron::kernels {
namespace {

using T = __nv_bfloat16;
constexpr int V = 8;  // bf16 per 16-byte pack
using P = Pack<T, V>;

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 8192;

// The backward's block: kColumnThreads packs side by side (256 columns), kRowLanes rows at a time.
constexpr int kColumnThreads = 32;
constexpr int kRowLanes = 8;
constexpr int kBlockColumns = kColumnThreads * V;
// Row chunks per column block: enough blocks to fill the GPU several times over.
constexpr int64_t kTargetBlocks = 2048;

// GeLU through core/cuda/activations.cuh's split at t = tanh(...), every operation of t rounded on
// its own, so the forward and the backward's recomputation give the same bits.
__global__ void __launch_bounds__(kThreads) forward_kernel(const T* __restrict__ pre, T* __restrict__ g, int64_t packs) {
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < packs; i += int64_t(gridDim.x) * kThreads) {
    const P x = load<P>(pre + i * V);
    P out;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const float xk = to_float(x.v[k]);
      out.v[k] = from_float<T>(gelu_from_tanh(xk, gelu_tanh_inner(xk)));
    }
    store(g + i * V, out);
  }
}

// Block (kColumnThreads, kRowLanes) over columns [blockIdx.x * 256, +256) and the rows of chunk
// blockIdx.y. With `partials`, the chunk's column sums of dL/dpre go to partials[blockIdx.y, :].
__global__ void __launch_bounds__(kColumnThreads* kRowLanes)
    backward_kernel(T* grad, const T* __restrict__ pre, T* __restrict__ g, int64_t rows, int64_t cols,
                    int64_t rows_per_chunk, float* __restrict__ partials) {
  __shared__ float lane_sums[kRowLanes][kBlockColumns];
  const int64_t col = int64_t(blockIdx.x) * kBlockColumns + int64_t(threadIdx.x) * V;
  const int64_t first = int64_t(blockIdx.y) * rows_per_chunk;
  const int64_t last = first + rows_per_chunk < rows ? first + rows_per_chunk : rows;
  float sums[V] = {};
  if (col < cols) {
    for (int64_t r = first + threadIdx.y; r < last; r += kRowLanes) {
      const int64_t at = r * cols + col;
      const P x = load<P>(pre + at);
      const P dg = load<P>(grad + at);
      P dpre, out;
#pragma unroll
      for (int k = 0; k < V; ++k) {
        const float xk = to_float(x.v[k]), t = gelu_tanh_inner(xk);
        out.v[k] = from_float<T>(gelu_from_tanh(xk, t));
        dpre.v[k] = from_float<T>(to_float(dg.v[k]) * gelu_derivative_from_tanh(xk, t));
        sums[k] += to_float(dpre.v[k]);
      }
      store(grad + at, dpre);
      store(g + at, out);
    }
  }
  if (partials == nullptr) return;
#pragma unroll
  for (int k = 0; k < V; ++k) lane_sums[threadIdx.y][threadIdx.x * V + k] = sums[k];
  __syncthreads();
  // The block's 256 columns, one per thread, summed over the row lanes in order.
  const int c = threadIdx.y * kColumnThreads + threadIdx.x;
  const int64_t out_col = int64_t(blockIdx.x) * kBlockColumns + c;
  if (out_col >= cols) return;
  float total = 0.0f;
#pragma unroll
  for (int lane = 0; lane < kRowLanes; ++lane) total += lane_sums[lane][c];
  partials[int64_t(blockIdx.y) * cols + out_col] = total;
}

// bias_grad[c] (+)= the sum of partials[:, c] over the chunks, in order.
__global__ void __launch_bounds__(kThreads) reduce_partials_kernel(const float* __restrict__ partials, int64_t chunks,
                                                                   int64_t cols, float* __restrict__ bias_grad,
                                                                   bool accumulate) {
  const int64_t c = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (c >= cols) return;
  float total = 0.0f;
  for (int64_t i = 0; i < chunks; ++i) total += partials[i * cols + c];
  bias_grad[c] = accumulate ? bias_grad[c] + total : total;
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

struct Chunks {
  int64_t count, rows_per_chunk;
};
Chunks chunks_of(int64_t rows, int64_t cols) {
  const int64_t column_blocks = ceil_div(cols, kBlockColumns);
  const int64_t wanted = std::clamp<int64_t>(ceil_div(kTargetBlocks, column_blocks), 1, std::max<int64_t>(1, ceil_div(rows, kRowLanes)));
  const int64_t rows_per_chunk = std::max<int64_t>(1, ceil_div(rows, wanted));
  return {ceil_div(rows, rows_per_chunk), rows_per_chunk};
}

}  // namespace

void gelu_tanh_forward(const void* pre, void* g, int64_t n, cudaStream_t stream) {
  FP8TRON_CHECK(n % V == 0, "gelu_tanh_forward: the element count is not a multiple of 8");
  const int64_t packs = n / V;
  if (packs == 0) return;
  const int blocks = int(std::min(ceil_div(packs, kThreads), kMaxBlocks));
  forward_kernel<<<blocks, kThreads, 0, stream>>>(static_cast<const T*>(pre), static_cast<T*>(g), packs);
  FP8TRON_CUDA_CHECK_LAUNCH("gelu forward_kernel");
}

int64_t gelu_backward_scratch_floats(int64_t rows, int64_t cols) {
  return rows == 0 ? 0 : chunks_of(rows, cols).count * cols;
}

void gelu_tanh_backward(void* grad, const void* pre, void* g, int64_t rows, int64_t cols, float* scratch,
                        float* bias_grad, bool accumulate_bias, cudaStream_t stream) {
  FP8TRON_CHECK(cols % V == 0, "gelu_tanh_backward: the column count is not a multiple of 8");
  if (rows == 0 || cols == 0) {
    if (bias_grad && !accumulate_bias) FP8TRON_CUDA_CHECK(cudaMemsetAsync(bias_grad, 0, cols * sizeof(float), stream));
    return;
  }
  const Chunks chunks = chunks_of(rows, cols);
  const dim3 grid(unsigned(ceil_div(cols, kBlockColumns)), unsigned(chunks.count)), block(kColumnThreads, kRowLanes);
  backward_kernel<<<grid, block, 0, stream>>>(static_cast<T*>(grad), static_cast<const T*>(pre), static_cast<T*>(g), rows,
                                              cols, chunks.rows_per_chunk, bias_grad ? scratch : nullptr);
  FP8TRON_CUDA_CHECK_LAUNCH("gelu backward_kernel");
  if (!bias_grad) return;
  reduce_partials_kernel<<<unsigned(ceil_div(cols, kThreads)), kThreads, 0, stream>>>(scratch, chunks.count, cols, bias_grad,
                                                                                   accumulate_bias);
  FP8TRON_CUDA_CHECK_LAUNCH("gelu reduce_partials_kernel");
}

}  // namespace fp8tron::kernels
