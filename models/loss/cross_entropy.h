// Cross entropy of vocabulary-parallel logits, fused: the per-token loss of logits [..., V/tp]
// (this rank's vocabulary rows [vocab_start, vocab_start + V/tp)) against global target ids, fp32
// result of the target's shape.
//
// On a GPU, one kernel reads the logits once in their own dtype (bf16 in bf16 runs) and keeps per
// row only the maximum, the sum of exponentials and the target's logit; backward writes the
// gradient over the logits in place. No fp32 [tokens, vocab] tensor exists (the unfused chain
// held an fp32 copy and the softmax: 6.6 GB and 16 ms of a GPT-2 124M step on an H200). Under
// tensor parallelism the three per-row values are combined over the group (maximum, rescaled sum,
// target logit), as Megatron's vocab-parallel cross entropy combines them. On the CPU the same
// formula runs as torch operations in fp32 (parallel/tensor_parallel.h), which is also the
// reference the GPU kernels are tested against.
#pragma once
#include <torch/torch.h>

#include "parallel/communicator.h"

namespace fp8tron {

torch::Tensor fused_vocab_parallel_cross_entropy(const torch::Tensor& logits, const torch::Tensor& target,
                                                 int64_t vocab_start, Communicator& tp);

}  // namespace fp8tron
