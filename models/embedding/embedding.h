// The word embedding's lookup, its weight gradient summed straight into the fp32 main gradient.
//
// torch's embedding backward writes a dense [vocab, hidden] gradient in the weight's dtype (a zeroed
// tensor, a sort and about thirty small kernels) and autograd then adds it into the weight's fp32
// main gradient: at GPT-2 124M a 77 MB bf16 tensor written and read, and the 154 MB main gradient
// read and written, every step. Under gradient-accumulation fusion (models/linear/main_grads.h), as the
// linears' weight gradients do (models/linear/linear_grads.h), this lookup's backward instead sorts the
// token ids and adds each token's summed rows into its row of the main gradient
// (models/embedding/embedding_grad_kernels.h): fp32 sums in a fixed order, the same bits on every run, and
// autograd gets no gradient for the weight (its hooks still run). The tied output layer's logits
// GEMM has already written that main gradient in the step by then; otherwise the optimizer zeroed
// it. (The weight is not among the step's first-written parameters (models/linear/main_grads.h):
// the paths that return its gradient to autograd, tensor parallelism and the fallback, add to the
// buffer. Should it be registered, this backward zeroes it before a first write.)
//
// Where it does not apply (the CPU, no main gradient, fusion off) it is torch's embedding and its
// backward, bit for bit.
#pragma once
#include <torch/torch.h>

#include "models/linear/main_grads.h"

namespace fp8tron {

// weight[tokens]: tokens of any shape (int64), weight [vocab, hidden] -> [tokens..., hidden].
// `main_grads`: the model's (null: torch's embedding and its backward).
torch::Tensor embedding_lookup(const torch::Tensor& tokens, const torch::Tensor& weight, const MainGradsPtr& main_grads);

}  // namespace fp8tron
