// CUDA kernels of the fused cross entropy (models/loss/cross_entropy.h), torch-free: raw pointers, sizes
// and a stream. Logits are row-major [rows, vocab] in `dtype` (0 fp32, 1 bf16, 2 fp16).
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/cuda/float_type.h"

namespace fp8tron::kernels {

// Per row, in one pass over the logits: the row's maximum, the sum of exp(logit - max) and the
// logit of `target[row]` (0 when target[row] is outside [0, vocab): another shard holds it).
void cross_entropy_row_stats(const void* logits, FloatType dtype, const int64_t* target, int64_t rows, int64_t vocab,
                             float* row_max, float* sum_exp, float* target_logit, cudaStream_t stream);

// d loss / d logits = (softmax - one_hot(target)) * grad_loss[row], softmax = exp(logit - lse[row]),
// written over the logits (in place; same dtype).
void cross_entropy_backward(void* logits, FloatType dtype, const int64_t* target, const float* lse,
                            const float* grad_loss, int64_t rows, int64_t vocab, cudaStream_t stream);

}  // namespace fp8tron::kernels
