// How Megatron splits a global tensor over tensor-parallel ranks, by the tensor's name:
//   - column-parallel weights (linear_qkv, linear_fc1, the word embeddings and output layer) by
//     their first dimension, a gated linear unit's fc1 as its gate half and its up half each split
//     (rank r holds [gate part r; up part r]);
//     MLA's up projections (linear_q_up_proj, linear_kv_up_proj, linear_q_proj) by their first;
//   - row-parallel weights (linear_proj, linear_fc2) by their second dimension;
//   - everything else is the same on every rank (norms, row-parallel biases, routers, MLA's down
//     projections).
// Routed experts' weights (mlp.experts.linear_fc<k>.weight<e>) split as the dense MLP's.
#pragma once
#include <torch/torch.h>

#include <string>
#include <vector>

#include "checkpoint/megatron/stored_tensor.h"

namespace fp8tron::checkpoint::megatron {

enum class TpSplit { kReplicated, kColumns, kGatedColumns, kRows };

TpSplit tp_split_of(const std::string& name, bool gated_linear_unit);

// The global tensor from every rank's part (in rank order), read when asked: a box of it reads the
// boxes of the parts it overlaps, no more. UserError when the parts' shapes do not join (replicated
// parts that differ, split ones that differ but along the split dimension; `what` names the tensor).
StoredTensor join_tp_parts(const std::vector<StoredTensor>& parts, TpSplit split, const std::string& what);
// The same of parts in memory, joined now.
torch::Tensor join_tp_parts(const std::vector<torch::Tensor>& parts, TpSplit split, const std::string& what);

// Rank `rank`'s part of `global` over `tp` ranks (a view where it can be). UserError when the split
// dimension does not divide.
torch::Tensor tp_part(const torch::Tensor& global, TpSplit split, int64_t rank, int64_t tp, const std::string& what);

}  // namespace fp8tron::checkpoint::megatron
