// The permutation index kernel of permute_kernels.h. One block per expert walks the expert's column
// of the routing map in chunks of the block's size; a block-wide exclusive scan counts, for each
// token, the routed and the unrouted tokens before it. With r routed and u unrouted tokens before
// token t, and `missing` padding tokens wanted (the earliest unrouted ones), t is in the expert's
// rows when routed or when u < missing, and its row is begin + r + min(u, missing). This replaces
// a chain of about twenty torch operations (casts, a transposed cumsum, where, scatter, the padding
// of the map, a table copy) whose host time, right after the dispatcher's one device-to-host copy,
// left the GPU idle.
#include <cuda_runtime.h>

#include <cstring>

#include "core/error.h"
#include "core/cuda/cuda_check.h"
#include "models/moe/permute_kernels.h"

namespace fp8tron::moe::kernels {
namespace {

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;

struct ExpertTable {
  int32_t begin[kMaxIndexExperts];
  int32_t missing[kMaxIndexExperts];
};

// Counts before each thread's token: routed ones in the low 32 bits, unrouted ones in the high.
using Counts = unsigned long long;

// Exclusive prefix sum of `value` over the block; *total receives the block's sum.
__device__ Counts block_exclusive_scan(Counts value, Counts* total) {
  __shared__ Counts warp_sums[kWarps];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  Counts inclusive = value;
  for (int offset = 1; offset < 32; offset *= 2) {
    const Counts up = __shfl_up_sync(0xffffffffu, inclusive, offset);
    if (lane >= offset) inclusive += up;
  }
  if (lane == 31) warp_sums[warp] = inclusive;
  __syncthreads();
  if (warp == 0) {
    Counts s = lane < kWarps ? warp_sums[lane] : 0;
    for (int offset = 1; offset < 32; offset *= 2) {
      const Counts up = __shfl_up_sync(0xffffffffu, s, offset);
      if (lane >= offset) s += up;
    }
    if (lane < kWarps) warp_sums[lane] = s;  // inclusive over the warps
  }
  __syncthreads();
  const Counts before_warp = warp == 0 ? 0 : warp_sums[warp - 1];
  *total = warp_sums[kWarps - 1];
  __syncthreads();  // warp_sums is reused by the next chunk
  return before_warp + inclusive - value;
}

__global__ void __launch_bounds__(kThreads)
    permute_index_kernel(const bool* map, int64_t row_stride, int64_t tokens, int64_t experts, const ExpertTable table,
                         int32_t* row_of, int64_t* flat_of_row) {
  const int64_t e = blockIdx.x;
  const int64_t begin = table.begin[e];
  const uint32_t missing = uint32_t(table.missing[e]);
  Counts carried = 0;
  for (int64_t base = 0; base < tokens; base += kThreads) {
    const int64_t t = base + threadIdx.x;
    const bool valid = t < tokens;
    const bool routed = valid && map[t * row_stride + e];
    Counts chunk_total;
    const Counts before = carried + block_exclusive_scan(valid ? (routed ? 1ull : 1ull << 32) : 0ull, &chunk_total);
    carried += chunk_total;
    if (!valid) continue;
    const uint32_t routed_before = uint32_t(before & 0xffffffffu), unrouted_before = uint32_t(before >> 32);
    const bool in_rows = routed || unrouted_before < missing;
    const int64_t row = begin + routed_before + min(unrouted_before, missing);
    row_of[t * experts + e] = in_rows ? int32_t(row) : -1;
    if (in_rows) flat_of_row[row] = t * experts + e;
  }
}

}  // namespace

void permute_index(const bool* map, int64_t map_row_stride, int64_t tokens, int64_t experts, const int32_t* begin,
                   const int32_t* missing, int32_t* row_of, int64_t* flat_of_row, cudaStream_t stream) {
  FP8TRON_CHECK(experts <= kMaxIndexExperts, "permute index: more than 1024 experts on one rank");
  FP8TRON_CHECK(tokens < (int64_t(1) << 31), "permute index: too many tokens for the 32-bit counts");
  if (experts == 0 || tokens == 0) return;
  ExpertTable table;
  std::memcpy(table.begin, begin, size_t(experts) * sizeof(int32_t));
  std::memcpy(table.missing, missing, size_t(experts) * sizeof(int32_t));
  permute_index_kernel<<<unsigned(experts), kThreads, 0, stream>>>(map, map_row_stride, tokens, experts, table, row_of,
                                                                  flat_of_row);
  FP8TRON_CUDA_CHECK_LAUNCH("moe permute_index_kernel");
}

}  // namespace fp8tron::moe::kernels
