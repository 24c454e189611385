// CUDA kernels of the fused SwiGLU (models/mlp/fused_swiglu.h), torch-free: raw pointers, sizes and a
// stream. x is row-major [rows, 2f], each row the gate half then the up half (the fc1 output's
// layout); y and dy are [rows, f]; all in `dtype`, contiguous. The math runs in fp32 and each
// result is rounded once, on store.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/cuda/float_type.h"

namespace fp8tron::kernels {

// y[r, c] = silu(x[r, c]) * x[r, f + c].
void swiglu_forward(const void* x, void* y, FloatType dtype, int64_t rows, int64_t f, cudaStream_t stream);

// The gradient of x, both halves in one pass from x and dy alone (silu is recomputed, not saved):
//   dx[r, c]     = dy[r, c] * x[r, f + c] * silu'(x[r, c])    (the gate's)
//   dx[r, f + c] = dy[r, c] * silu(x[r, c])                    (the up projection's)
// with silu'(g) = s (1 + g (1 - s)), s = sigmoid(g): torch's silu_backward. With `y` (not null)
// the forward's y is written again, bit for bit (the SwiGLU-then-fc2 op recomputes fc2's input
// for its weight gradient instead of saving it, models/mlp/fused_swiglu.h).
void swiglu_backward(const void* dy, const void* x, void* dx, FloatType dtype, int64_t rows, int64_t f,
                     cudaStream_t stream, void* y = nullptr);

}  // namespace fp8tron::kernels
