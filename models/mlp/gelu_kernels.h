// CUDA kernels of the fused bf16 GeLU MLP (models/mlp/fused_gelu_mlp.h), torch-free: raw pointers,
// sizes and a stream. GeLU is the tanh approximation (Megatron's bias_gelu):
//   gelu(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
// Matrices are row-major [rows, cols] bf16, contiguous, cols a multiple of 8 (16-byte packs).
//
// The MLP saves fc1's pre-activation only; the backward recomputes gelu(pre) for fc2's weight
// gradient with the forward's arithmetic (explicitly rounded fp32 operations, no contraction), so
// it is bit for bit the tensor the forward fed to fc2.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

namespace fp8tron::kernels {

// g = gelu(pre), n elements (a multiple of 8).
void gelu_tanh_forward(const void* pre, void* g, int64_t n, cudaStream_t stream);

// The fp32 scratch the backward's bias-gradient sums need, in floats.
int64_t gelu_backward_scratch_floats(int64_t rows, int64_t cols);

// One pass over [rows, cols]: `grad` holds dL/dg on entry and dL/dpre on return (in place), `g`
// receives gelu(pre) again, and, when `bias_grad` is not null, the column sums of dL/dpre (as
// stored, in bf16) go to bias_grad [cols] in fp32: written, or added when `accumulate_bias`
// (fc1's bias gradient, summed over row chunks in a fixed order: deterministic). `scratch`:
// gelu_backward_scratch_floats() floats, used when bias_grad is not null.
void gelu_tanh_backward(void* grad, const void* pre, void* g, int64_t rows, int64_t cols, float* scratch,
                        float* bias_grad, bool accumulate_bias, cudaStream_t stream);

}  // namespace fp8tron::kernels
