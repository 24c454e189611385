// Tensor- and sequence-parallel communication as paired autograd functions (Megatron's
// mappings.py): each forward collective has its backward partner. Activations are
// [sequence, batch, hidden]; sequence-parallel shards split dimension 0.
#pragma once
#include <torch/torch.h>

#include "parallel/communicator.h"

namespace fp8tron {

// Forward identity, backward all-reduce: enters a tensor-parallel region.
torch::Tensor copy_to_tp(const torch::Tensor& x, Communicator& tp);
// Forward all-reduce, backward identity: leaves a tensor-parallel region (row-parallel output).
torch::Tensor reduce_from_tp(const torch::Tensor& x, Communicator& tp);
// Forward all-gather along the sequence, backward reduce-scatter (column-parallel input with SP).
torch::Tensor gather_from_sp(const torch::Tensor& x, Communicator& tp);
// Forward reduce-scatter along the sequence, backward all-gather (row-parallel output with SP).
torch::Tensor reduce_scatter_to_sp(const torch::Tensor& x, Communicator& tp);
// Forward all-gathers the last (feature) dimension, backward keeps this rank's slice
// (a column-parallel output gathered whole, as MTP's eh_proj).
torch::Tensor gather_from_tp_last_dim(const torch::Tensor& x, Communicator& tp);
// Forward keeps this rank's sequence chunk, backward all-gathers (after the embedding with SP).
torch::Tensor scatter_to_sp(const torch::Tensor& x, Communicator& tp);

// Cross entropy over vocabulary shards without gathering the logits: logits [s, b, V/tp] of the
// vocabulary rows [vocab_start, vocab_start + V/tp); returns the per-token loss [s, b] in fp32.
torch::Tensor vocab_parallel_cross_entropy(const torch::Tensor& logits, const torch::Tensor& target, int64_t vocab_start,
                                           Communicator& tp);

// Embedding lookup of vocabulary shard rows [vocab_start, vocab_start + rows); tokens outside the
// shard contribute zeros, and the partial results are summed over the group.
torch::Tensor vocab_parallel_embedding(const torch::Tensor& tokens, const torch::Tensor& weight, int64_t vocab_start,
                                       Communicator& tp);

}  // namespace fp8tron
