// Tensor layouts that differ between fp8tron (Megatron's) and Hugging Face's classes, in both
// directions: the exporter (hf_export.cpp) uses the splits, the importer (hf_import.cpp) their
// inverses, so one definition fixes both.
#pragma once
#include <torch/torch.h>

#include <cstdint>

namespace fp8tron::hf {

// The attention shape the fused QKV tensor is laid out by.
struct QkvShape {
  int64_t heads, groups, head_dim;
};

// Megatron's fused linear_qkv rows (per query group: its query heads, one key, one value) as
// separate q, k, v rows; query head j of group g is head g * (heads / groups) + j, Hugging Face's
// repeat_kv order. Works for weights [rows, in] and biases [rows].
struct Qkv {
  torch::Tensor q, k, v;
};
Qkv split_qkv(const torch::Tensor& qkv, const QkvShape& s);
// The inverse: q [heads * head_dim, ...], k and v [groups * head_dim, ...] -> Megatron's rows.
torch::Tensor fuse_qkv(const Qkv& qkv, const QkvShape& s);

// --rotary-interleaved rotates channel pairs (2i, 2i+1); Hugging Face's Llama rotates (i, i + d/2).
// Permuting each head's rows to [0, 2, 4, ..., 1, 3, 5, ...] turns the first into the second (the
// scores are unchanged: q and k move alike); interleave_heads undoes it. Rows [heads * head_dim, ...].
torch::Tensor deinterleave_heads(const torch::Tensor& w, int64_t head_dim);
torch::Tensor interleave_heads(const torch::Tensor& w, int64_t head_dim);

}  // namespace fp8tron::hf
