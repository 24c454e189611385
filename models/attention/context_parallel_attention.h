// Causal self-attention over a sequence split across the context-parallel ranks (Transformer
// Engine's attention with context parallelism, the --cp-comm-type of each layer):
//
//   p2p         ring attention. Each rank holds queries, keys and values of chunks r and
//               2 CP - 1 - r. Over CP steps the key/value blocks travel around the ring (the next
//               block's transfer runs while the current one is computed), each step's partial
//               attention is merged into the result with the softmax log-sum-exp. Backward passes
//               the blocks around again, the key/value gradients travelling with them back to
//               their owner. Step 0 is the local causal block; at step i the block of rank
//               src = r - i arrives: src < r -> all local queries see its first chunk; src > r ->
//               only the local second chunk sees it, whole. Every rank does the same work.
//   all_gather  keys and values all-gathered (backward: reduce-scattered); each local chunk attends
//               to the prefix of the sequence it may see (a full block and a causal diagonal
//               block, merged the same way).
//   a2a         Ulysses: all-to-all from sequence shards to head shards, ordinary causal
//               attention over the whole sequence on CP-th of the heads, all-to-all back.
//   a2a+p2p     hierarchical: all-to-all within the first level of
//               --hierarchical-context-parallel-sizes, then the ring over the second.
// Blocks run through the fused kernels that return the LSE on GPUs (models/attention/attention_block.h),
// on the CPU through the math path with the same semantics.
#pragma once
#include <torch/torch.h>

#include "parallel/context_parallel.h"

namespace fp8tron {

// q, k [s_local, b, heads | groups, d], v [s_local, b, groups, dv]: this rank's sequence shard
// (load-balanced layout) and tensor-parallel heads; dv may differ from d (multi-latent attention).
// Returns [s_local, b, heads, dv].
torch::Tensor context_parallel_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                         const ContextParallelContext& cp, CpCommType type, double dropout, double scale);

// Ring step `step` of `rank` in a ring of `size` (see above): which local query rows take part,
// which part of the arriving key/value block, and whether it is the causal diagonal block.
struct RingStep {
  bool all_queries = true;      // false: the second local chunk only
  bool first_kv_chunk = false;  // true: the block's first chunk only
  bool causal = false;
};
RingStep ring_step(int rank, int size, int step);

// The ring attention itself, on [b, heads, s_local, d] / [b, groups, s_local, d] tensors over the
// ring `ring` (the whole context-parallel group, or the second hierarchical level).
torch::Tensor ring_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, Communicator& ring,
                             double dropout, double scale);

}  // namespace fp8tron
