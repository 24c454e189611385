// Column sums of dY for the bf16 linears' bias gradients. cuBLASLt's BGRADB epilogue runs its sum as
// a second kernel that took 35-59 us per call at GPT 1.3B shapes on an H200 (docs/benchmarks.md,
// session 12), where a pass over dY costs its bytes: 100 MB for qkv, 25 us at 4 TB/s.

#include <algorithm>

#include "fp8/cuda_check.h"
#include "models/column_sums_kernels.h"
#include "models/kernel_float.h"
#include "models/kernel_pack.h"

namespace fp8tron::kernels {
namespace {

using T = __nv_bfloat16;
constexpr int V = 8;  // bf16 per 16-byte pack
using P = Pack<T, V>;

// A block: kColumnThreads packs side by side (256 columns), kRowLanes rows at a time.
constexpr int kColumnThreads = 32;
constexpr int kRowLanes = 8;
constexpr int kBlockColumns = kColumnThreads * V;
constexpr int kReduceThreads = 256;
// Row chunks per column block: enough blocks to fill the GPU several times over.
constexpr int64_t kTargetBlocks = 2048;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Block (kColumnThreads, kRowLanes) over columns [blockIdx.x * 256, +256) and the rows of chunk
// blockIdx.y: the chunk's column sums go to partials[blockIdx.y, :].
__global__ void __launch_bounds__(kColumnThreads* kRowLanes)
    chunk_sums_kernel(const T* __restrict__ x, int64_t rows, int64_t cols, int64_t rows_per_chunk,
                      float* __restrict__ partials) {
  __shared__ float lane_sums[kRowLanes][kBlockColumns];
  const int64_t col = int64_t(blockIdx.x) * kBlockColumns + int64_t(threadIdx.x) * V;
  const int64_t first = int64_t(blockIdx.y) * rows_per_chunk;
  const int64_t last = first + rows_per_chunk < rows ? first + rows_per_chunk : rows;
  float sums[V] = {};
  if (col < cols)
    for (int64_t r = first + threadIdx.y; r < last; r += kRowLanes) {
      const P v = load<P>(x + r * cols + col);
#pragma unroll
      for (int k = 0; k < V; ++k) sums[k] += to_float(v.v[k]);
    }
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

// out[c] (+)= the sum of partials[:, c] over the chunks, in order.
__global__ void __launch_bounds__(kReduceThreads) add_partials_kernel(const float* __restrict__ partials, int64_t chunks,
                                                                      int64_t cols, float* __restrict__ out,
                                                                      bool accumulate) {
  const int64_t c = int64_t(blockIdx.x) * kReduceThreads + threadIdx.x;
  if (c >= cols) return;
  float total = 0.0f;
  for (int64_t i = 0; i < chunks; ++i) total += partials[i * cols + c];
  out[c] = accumulate ? out[c] + total : total;
}

struct Chunks {
  int64_t count, rows_per_chunk;
};
Chunks chunks_of(int64_t rows, int64_t cols) {
  const int64_t column_blocks = ceil_div(cols, kBlockColumns);
  const int64_t wanted =
      std::clamp<int64_t>(ceil_div(kTargetBlocks, column_blocks), 1, std::max<int64_t>(1, ceil_div(rows, kRowLanes)));
  const int64_t rows_per_chunk = std::max<int64_t>(1, ceil_div(rows, wanted));
  return {ceil_div(rows, rows_per_chunk), rows_per_chunk};
}

}  // namespace

int64_t column_sums_scratch_floats(int64_t rows, int64_t cols) { return rows == 0 ? 0 : chunks_of(rows, cols).count * cols; }

void column_sums_bf16(const void* x, int64_t rows, int64_t cols, float* scratch, float* out, bool accumulate,
                      cudaStream_t stream) {
  FP8TRON_CHECK(cols % V == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0,
                "column_sums_bf16: the columns are not whole 16-byte packs");
  if (cols == 0) return;
  if (rows == 0) {
    if (!accumulate) FP8TRON_CUDA_CHECK(cudaMemsetAsync(out, 0, size_t(cols) * sizeof(float), stream));
    return;
  }
  const Chunks chunks = chunks_of(rows, cols);
  const dim3 grid(unsigned(ceil_div(cols, kBlockColumns)), unsigned(chunks.count)), block(kColumnThreads, kRowLanes);
  chunk_sums_kernel<<<grid, block, 0, stream>>>(static_cast<const T*>(x), rows, cols, chunks.rows_per_chunk, scratch);
  FP8TRON_CUDA_CHECK_LAUNCH("column_sums chunk_sums_kernel");
  add_partials_kernel<<<unsigned(ceil_div(cols, kReduceThreads)), kReduceThreads, 0, stream>>>(scratch, chunks.count, cols,
                                                                                             out, accumulate);
  FP8TRON_CUDA_CHECK_LAUNCH("column_sums add_partials_kernel");
}

}  // namespace fp8tron::kernels
