// Token permutation for mixture-of-experts dispatch (Megatron-Core's permute / unpermute /
// sort_chunks_by_idxs), as autograd functions over fused gather / scatter-sum kernels on the GPU
// (models/moe/permute.cu) and index_select / index_add on the CPU, with the same semantics:
//   permute    rows grouped expert-major, within an expert in increasing token order: the row of
//              (token t, expert e) is offset_e + #{t' < t routed to e}. Backward: the combine of
//              the row gradients (each token sums its rows).
//   unpermute  out[t] = sum_e probs[t, e] * y[row(t, e)] in fp32 (experts in ascending order),
//              then the output dtype. Backward: dy[row] = probs * dout[t] and
//              dprobs[t, e] = <y[row(t, e)], dout[t]>.
// fp8tron applies the routing probabilities here, at the combine (as Megatron-Core's dispatchers
// long did). Current Megatron-Core multiplies them inside the experts instead (the activation
// times the prob before fc2, and the fc2 bias times the prob): the same sum
// sum_e p_e * expert_e(x), rounded at a different place.
#pragma once
#include <torch/torch.h>

#include <vector>

namespace fp8tron::moe {

// Where each routed (token, expert) pair of a routing map lands.
struct PermuteIndex {
  torch::Tensor row_of;       // [T, E] int32: permuted row of (t, e), -1 when not routed
  torch::Tensor flat_of_row;  // [rows] int64: t * E + e of each permuted row
  std::vector<int64_t> counts;  // rows per expert (host)
  int64_t rows = 0;
  int64_t tokens() const { return row_of.size(0); }
  int64_t experts() const { return row_of.size(1); }
};

// `counts` are the map's column sums, already on the host (the dispatcher's one device-to-host copy).
// pad_multiple > 0 (--moe-router-padding-for-quantization): each expert's rows also take its
// earliest unrouted tokens until their number is a multiple of it, as pad_routing_map pads the map
// (their probabilities are zero); index.counts are then the padded counts. On the GPU one kernel
// (permute_kernels.h) builds the whole index.
PermuteIndex make_permute_index(const torch::Tensor& map, const std::vector<int64_t>& counts, int64_t pad_multiple = 0);

// `count` rounded up to a multiple of `multiple` (0: unchanged).
int64_t padded_count(int64_t count, int64_t multiple);

// x [T, H] -> [rows, H]. Differentiable in x.
torch::Tensor permute(const torch::Tensor& x, const PermuteIndex& index);

// y [rows, H] -> [T, H] in `out_dtype` (y's dtype or fp32). `probs` [T, E] weights the rows
// (undefined: weight 1). Differentiable in y and probs.
torch::Tensor unpermute(const torch::Tensor& y, const PermuteIndex& index, const torch::Tensor& probs,
                        torch::Dtype out_dtype);

// Cuts x's rows into chunks of `sizes` and concatenates them in the order `order` (a permutation
// of the chunk ids). Differentiable (backward: the inverse reordering).
torch::Tensor sort_chunks(const torch::Tensor& x, const std::vector<int64_t>& sizes, const std::vector<int64_t>& order);

// The row reorderings of sort_chunks as a gather index (for tests and the CPU path).
std::vector<int64_t> sort_chunks_source_rows(const std::vector<int64_t>& sizes, const std::vector<int64_t>& order);

}  // namespace fp8tron::moe
