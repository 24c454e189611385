// CUDA kernels of the MoE token permutation (models/moe/permute.cu, permute_index.cu): raw
// pointers, sizes and a stream, no torch. Rows are `hidden` contiguous elements. A permuted row is
// named by its routed pair's flat index t * experts + e (PermuteIndex::flat_of_row): its source
// token is flat / experts, its probability probs[flat]. models/moe/permute.cpp wraps them in
// autograd functions and holds the CPU path with the same semantics (the reference the GPU tests
// compare against). All of them are deterministic: no floating-point atomics; sums run over the
// experts of a token in ascending order, in fp32, with separately rounded products (as the CPU
// path's index_add).
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

namespace fp8tron::moe::kernels {

enum class DType : uint8_t { kF32, kBF16, kF16 };

// The most experts one rank's permutation index takes (its per-expert table is a kernel argument).
constexpr int64_t kMaxIndexExperts = 1024;

// The permutation index of a routing map, in one launch (one block per expert scanning its column):
// map [tokens, experts] bool with row stride `map_row_stride`; `begin` and `missing` are host
// arrays of `experts` values (passed by value): begin[e] the first row of expert e, missing[e] how
// many of its earliest unrouted tokens pad it (0: none). Writes row_of
// [tokens, experts] (the pair's row, -1 when neither routed nor padding) and flat_of_row[row] =
// t * experts + e. Rows of an expert are its routed and padding tokens in increasing token order.
void permute_index(const bool* map, int64_t map_row_stride, int64_t tokens, int64_t experts, const int32_t* begin,
                   const int32_t* missing, int32_t* row_of, int64_t* flat_of_row, cudaStream_t stream);

// out[r] = x[flat_of_row[r] / experts], times probs[flat_of_row[r]] (in fp32) when probs is given.
void gather_rows(const void* x, void* out, DType dtype, const int64_t* flat_of_row, int64_t experts, const float* probs,
                 int64_t rows, int64_t hidden, cudaStream_t stream);

// out[t] = sum over e with row_of[t, e] >= 0 of (probs[t, e] x) y[row_of[t, e]], accumulated in
// fp32, written in out_dtype (y's dtype or fp32); probs may be null (weight 1).
void combine_rows(const void* y, DType y_dtype, const int32_t* row_of, const float* probs, void* out, DType out_dtype,
                  int64_t tokens, int64_t experts, int64_t hidden, cudaStream_t stream);

// dprobs[t, e] = <y[row_of[t, e]], dout[t]> (fp32), 0 where row_of < 0.
void prob_grads(const void* y, const void* dout, DType dtype, const int32_t* row_of, float* dprobs, int64_t tokens,
                int64_t experts, int64_t hidden, cudaStream_t stream);

// Output chunk i (rows [dst_start[i], dst_start[i + 1]) with dst_start[chunks] = rows) copies
// input rows from src_start[i]: a reordering of contiguous chunks.
void sort_chunks(const void* x, void* out, DType dtype, const int64_t* src_start, const int64_t* dst_start,
                 int64_t chunks, int64_t rows, int64_t hidden, cudaStream_t stream);

}  // namespace fp8tron::moe::kernels
