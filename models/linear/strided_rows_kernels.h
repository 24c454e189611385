// A copy of rows between two strided 4-D layouts (models/attention/qkv_split.h uses it to assemble the QKV
// gradient): torch-free, raw pointers and a stream. A row is `row_elems` contiguous elements; rows
// are indexed by four outer coordinates, each with its own element stride in the source and in the
// destination. Element size only matters for alignment: the copy moves bytes, in 16-byte vectors
// where the row length, the strides and both pointers allow, else one element at a time.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

namespace fp8tron::kernels {

struct StridedRows {
  int64_t sizes[4] = {1, 1, 1, 1};        // rows = the product
  int64_t src_strides[4] = {0, 0, 0, 0};  // in elements
  int64_t dst_strides[4] = {0, 0, 0, 0};
  int64_t row_elems = 0;
  int elem_bytes = 2;
};

// dst row (i, j, k, l) := src row (i, j, k, l).
void copy_strided_rows(const void* src, void* dst, const StridedRows& layout, cudaStream_t stream);

}  // namespace fp8tron::kernels
