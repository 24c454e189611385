// The word embedding's weight gradient summed straight into its fp32 main gradient
// (models/embedding/embedding.h), torch-free: raw pointers, sizes and a stream.
//
// Input: the lookups sorted by token id with a stable sort (sorted_ids, and each lookup's row of
// `grad` in positions), so that the rows of one token lie together in their order in the batch.
// The sorted lookups are cut into chunks of kEmbeddingGradChunk. Each chunk's block sums its runs of
// equal ids row by row in fp32. A run that lies wholly inside its chunk is the whole gradient of
// its token: it is added to that token's row of the main gradient at once. A token whose rows cross
// a chunk boundary leaves one partial row per chunk, and the chunk holding its first row adds them
// up, in chunk order. No atomics: every value is summed in a fixed order, so the result is the same
// bits on every run, and no two blocks write one row.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/cuda/float_type.h"

namespace fp8tron::kernels {

constexpr int64_t kEmbeddingGradChunk = 32;

struct EmbeddingGradShape {
  int64_t lookups = 0;  // rows of grad
  int64_t hidden = 0;
  FloatType dtype = FloatType::kBFloat16;  // grad's
};

// fp32 floats of the partial rows the pass needs: 2 per chunk, `hidden` each.
int64_t embedding_grad_workspace_floats(const EmbeddingGradShape& shape);

// main_grad[id] += the sum of grad[positions[i]] over the lookups i of each id. grad is
// [lookups, hidden] contiguous in shape.dtype; main_grad is fp32 [vocab, hidden] contiguous. The
// ids must be rows of main_grad: the caller's forward lookup checked them (an id out of range
// would write outside the row range).
void embedding_grad_into_main_grad(const EmbeddingGradShape& shape, const int64_t* sorted_ids, const int64_t* positions,
                                   const void* grad, float* main_grad, float* workspace, cudaStream_t stream);

}  // namespace fp8tron::kernels
