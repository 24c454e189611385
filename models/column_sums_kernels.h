// Column sums of a row-major bf16 matrix in fp32: a linear's bias gradient, the sum of dY over its
// tokens, as one pass over dY (models/dense_gemm.h). torch-free: raw pointers, sizes and a stream.
// Deterministic: each block sums a chunk of rows into one partial row of `scratch`, and a second
// kernel adds the partial rows in a fixed order (no atomics), as the GeLU backward's bias sums do.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

namespace fp8tron::kernels {

// The fp32 scratch column_sums() needs, in floats.
int64_t column_sums_scratch_floats(int64_t rows, int64_t cols);

// out[c] (+)= sum over r of x[r, c], for x [rows, cols] bf16, contiguous, cols a multiple of 8 and x
// 16-byte aligned (16-byte packs); written, or added when `accumulate`. out: cols fp32 values.
void column_sums_bf16(const void* x, int64_t rows, int64_t cols, float* scratch, float* out, bool accumulate,
                      cudaStream_t stream);

}  // namespace fp8tron::kernels
