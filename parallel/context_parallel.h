// Context parallelism: the sequence of every micro-batch is split over the context-parallel ranks
// (Megatron's load-balanced split), and attention, the only place where tokens meet, exchanges
// what it needs over the context-parallel group (models/attention/context_parallel_attention.h).
//
// The load-balanced split: the sequence is cut into 2 x CP equal chunks and rank r holds chunks r
// and 2 CP - 1 - r, in that order. Under causal attention an early chunk has little to attend to
// and a late one much; pairing them gives every rank the same work.
//
// This file holds the split, the groups (context parallel x data parallel for the gradients, the
// levels of hierarchical context parallelism) and the communication as autograd functions, each
// paired with its backward partner (parallel/tensor_parallel.h's convention).
#pragma once
#include <torch/torch.h>

#include <memory>
#include <vector>

#include "core/config/context_parallel_config.h"
#include "parallel/parallel_state.h"

namespace fp8tron {

// What a module needs to know about context parallelism.
struct ContextParallelContext {
  ContextParallelConfig config;
  std::shared_ptr<Communicator> group;  // the ranks sharing this rank's sequences (null: no CP)
  // --hierarchical-context-parallel-sizes: the first level (all-to-all, consecutive ranks of the
  // group) and the second (the ring over the first level's groups); null without.
  std::shared_ptr<Communicator> a2a_level, p2p_level;

  int size() const { return group ? group->size() : 1; }
  int rank() const { return group ? group->rank() : 0; }
  bool enabled() const { return size() > 1; }
};

// ---- the load-balanced split ------------------------------------------------------------------
// The two chunks (of 2 x size) that `rank` holds.
std::pair<int64_t, int64_t> cp_chunks(int size, int rank);
// Global positions of this rank's tokens, in its order: [seq_length / size] int64 on the CPU.
torch::Tensor cp_positions(int64_t seq_length, int size, int rank);
// This rank's part of x along `dim` (chunks r and 2 size - 1 - r, concatenated); contiguous.
torch::Tensor cp_shard(const torch::Tensor& x, int64_t dim, int size, int rank);
// The inverse: every rank's part (in rank order) back into the whole sequence along `dim`.
torch::Tensor cp_unshard(const std::vector<torch::Tensor>& parts, int64_t dim);

// Megatron's roll_tensor(shifts=-1) with a context-parallel group, on this rank's shard of x
// along `dim` (load-balanced layout): the whole sequence moves one position left and its last
// position becomes 0. Each local chunk shifts left and takes as its last element the first one of
// the chunk that follows it in the sequence: chunk r + 1 (rank r + 1's first chunk, or this rank's
// own second chunk when r = size - 1) and chunk 2 size - r (rank r - 1's second chunk; none after
// the last chunk, held by rank 0). Not differentiable (token ids, labels, masks, positions).
// Every rank of `group` calls it.
torch::Tensor cp_roll_left(const torch::Tensor& x, int64_t dim, Communicator& group);

// ---- groups -----------------------------------------------------------------------------------
struct ContextParallelGroups {
  std::shared_ptr<Communicator> dp_cp;           // data x context parallel: the gradients' replicas
  std::shared_ptr<Communicator> a2a_level, p2p_level;  // hierarchical levels (empty sizes: null)
};
// Creates the groups (collective: every rank calls it with the same arguments, after
// build_parallel_state). `hierarchical_sizes`: [a2a, p2p] with a2a x p2p = cp, or empty. The
// levels are Megatron's create_hierarchical_groups over each context-parallel group: level 0 of
// consecutive members, level 1 strided by the first level's size.
ContextParallelGroups build_context_parallel_groups(const ParallelState& s, const std::vector<int>& hierarchical_sizes);

// The parallel state as the data-parallel machinery sees it under context parallelism: the
// gradients of the context-parallel ranks of a sequence are partial sums, to be reduced with the
// data-parallel replicas', and the optimizer shards, checkpoints and amax reductions span
// data x context parallel (Megatron's data_parallel_group_with_cp). So: dp = dp_cp, sizes.dp =
// dp x cp, sizes.cp = 1. The batch sampler keeps using the real data-parallel rank.
ParallelState with_context_parallel_in_data_parallel(const ParallelState& s, std::shared_ptr<Communicator> dp_cp);

// ---- communication ----------------------------------------------------------------------------
// Ulysses all-to-all over `group` (size a): x [s_local, b, heads, d], a sequence shard in the
// load-balanced layout, becomes [a x s_local, b, heads / a, d]: the a ranks' shards joined (the
// group's sequence in order, or with a hierarchical level, the super-chunks r and 2P - 1 - r of a
// P-rank ring), with this rank's a-th of the heads. Backward: the inverse exchange.
torch::Tensor cp_sequence_to_heads(const torch::Tensor& x, Communicator& group);
// The inverse of cp_sequence_to_heads (attention output back to sequence shards).
torch::Tensor cp_heads_to_sequence(const torch::Tensor& x, Communicator& group);
// All-gather of sequence shards (dim 0) into the whole sequence in order; backward reduce-scatters
// the gradient back to the shards (the all_gather --cp-comm-type's keys and values).
torch::Tensor cp_gather_sequence(const torch::Tensor& x, Communicator& group);

// One step of a ring: sends `send` to the next rank of `ring` and receives the previous rank's
// tensor into `recv` (same size), asynchronously (NCCL: on the group's communication stream).
std::unique_ptr<CommWork> ring_exchange(Communicator& ring, const torch::Tensor& send, torch::Tensor& recv, int tag);

}  // namespace fp8tron
