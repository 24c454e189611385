// The split of the fused QKV projection's output into queries, keys and values, per query group:
// qkv [s, b, groups, per_group + 2, d] -> q [s, b, groups, per_group, d], k and v [s, b, groups, d],
// all views of qkv. With the attention output gate each group holds its queries' gates after the
// queries (Megatron's layout): qkv [s, b, groups, 2 per_group + 2, d], the gate shaped as q. The
// backward assembles the gradients into one contiguous dqkv. torch's
// split backward (a concatenation) copies each gradient with its generic strided kernel, an element
// at a time (3.1 ms per GPT 1.3B step on an H200); on the GPU this one copies 16-byte vectors.
#pragma once
#include <torch/torch.h>

#include <vector>

namespace fp8tron {

// {q, k, v}, or {q, k, v, gate} with `gated`. On CPU tensors: split_with_sizes (the same values and
// gradients).
std::vector<torch::Tensor> split_qkv(const torch::Tensor& qkv, int64_t per_group, bool gated = false);

}  // namespace fp8tron
