// The embedding's weight gradient into its main gradient (models/embedding/embedding_grad_kernels.h).
#include "core/cuda/cuda_check.h"
#include "models/embedding/embedding_grad_kernels.h"

namespace fp8tron::kernels {
namespace {

constexpr int kThreads = 256;
constexpr int64_t K = kEmbeddingGradChunk;

__host__ __device__ int64_t chunks_of(int64_t lookups) { return (lookups + K - 1) / K; }

// Partial rows: [chunk][0] the chunk's first run when it continues the previous chunk's, [chunk][1]
// its last run when that continues into the next chunk (and does not continue the previous one).
__device__ int64_t partial_row(int64_t chunk, int which, int64_t hidden) { return (chunk * 2 + which) * hidden; }

// One block per chunk; each thread owns columns tid, tid + blockDim, ... and walks the chunk's rows
// in order, summing runs of equal ids in fp32.
template <class T>
__global__ void __launch_bounds__(kThreads) chunk_sums_kernel(const int64_t* sorted_ids, const int64_t* positions,
                                                               const T* grad, float* main_grad, float* workspace,
                                                               int64_t lookups, int64_t hidden) {
  __shared__ int64_t ids[K], rows[K];
  const int64_t begin = int64_t(blockIdx.x) * K, n = min(K, lookups - begin);
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    ids[i] = sorted_ids[begin + i];
    rows[i] = positions[begin + i];
  }
  __syncthreads();
  // Whether the first run continues the previous chunk's last one, the last run into the next chunk.
  const bool from_previous = begin > 0 && sorted_ids[begin - 1] == ids[0];
  const bool into_next = begin + n < lookups && sorted_ids[begin + n] == ids[n - 1];
  for (int64_t col = threadIdx.x; col < hidden; col += blockDim.x) {
    int64_t start = 0;
    while (start < n) {
      const int64_t id = ids[start];
      float sum = 0.0f;
      int64_t i = start;
      for (; i < n && ids[i] == id; ++i) sum += to_float(grad[rows[i] * hidden + col]);
      const bool first = start == 0 && from_previous, last = i == n && into_next;
      if (first) workspace[partial_row(blockIdx.x, 0, hidden) + col] = sum;
      else if (last) workspace[partial_row(blockIdx.x, 1, hidden) + col] = sum;
      else main_grad[id * hidden + col] += sum;
      start = i;
    }
  }
}

// One block per chunk: where the chunk's last run starts a token that continues into later chunks,
// adds the token's partial rows in chunk order and then into its row of the main gradient.
__global__ void __launch_bounds__(kThreads) crossing_sums_kernel(const int64_t* sorted_ids, float* main_grad,
                                                                  const float* workspace, int64_t lookups, int64_t hidden) {
  const int64_t chunk = blockIdx.x, begin = chunk * K, end = min(begin + K, lookups);
  const int64_t id = sorted_ids[end - 1];
  const bool into_next = end < lookups && sorted_ids[end] == id;
  const bool whole_chunk_continued = chunk > 0 && sorted_ids[begin] == id && sorted_ids[begin - 1] == id;
  if (!into_next || whole_chunk_continued) return;  // uniform over the block
  const int64_t chunks = chunks_of(lookups);
  for (int64_t col = threadIdx.x; col < hidden; col += blockDim.x) {
    float sum = workspace[partial_row(chunk, 1, hidden) + col];
    for (int64_t next = chunk + 1; next < chunks; ++next) {
      sum += workspace[partial_row(next, 0, hidden) + col];
      const int64_t next_end = min((next + 1) * K, lookups);
      if (next_end == lookups || sorted_ids[next_end] != id) break;
    }
    main_grad[id * hidden + col] += sum;
  }
}

template <class T>
void launch(const EmbeddingGradShape& s, const int64_t* sorted_ids, const int64_t* positions, const void* grad,
            float* main_grad, float* workspace, cudaStream_t stream) {
  const int64_t chunks = chunks_of(s.lookups);
  chunk_sums_kernel<T><<<unsigned(chunks), kThreads, 0, stream>>>(sorted_ids, positions, static_cast<const T*>(grad),
                                                                   main_grad, workspace, s.lookups, s.hidden);
  FP8TRON_CUDA_CHECK_LAUNCH("embedding chunk_sums_kernel");
  crossing_sums_kernel<<<unsigned(chunks), kThreads, 0, stream>>>(sorted_ids, main_grad, workspace, s.lookups, s.hidden);
  FP8TRON_CUDA_CHECK_LAUNCH("embedding crossing_sums_kernel");
}

}  // namespace

int64_t embedding_grad_workspace_floats(const EmbeddingGradShape& s) { return chunks_of(s.lookups) * 2 * s.hidden; }

void embedding_grad_into_main_grad(const EmbeddingGradShape& s, const int64_t* sorted_ids, const int64_t* positions,
                                   const void* grad, float* main_grad, float* workspace, cudaStream_t stream) {
  if (s.lookups == 0 || s.hidden == 0) return;
  switch (s.dtype) {
    case FloatType::kFloat32: return launch<float>(s, sorted_ids, positions, grad, main_grad, workspace, stream);
    case FloatType::kBFloat16: return launch<__nv_bfloat16>(s, sorted_ids, positions, grad, main_grad, workspace, stream);
    case FloatType::kFloat16: return launch<__half>(s, sorted_ids, positions, grad, main_grad, workspace, stream);
  }
}

}  // namespace fp8tron::kernels
