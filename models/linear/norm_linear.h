// A norm and the linear that reads it as one autograd op, Transformer Engine's LayerNormLinear for
// bf16/fp16 linears with gradient-accumulation fusion on one tensor-parallel rank (the qkv
// projection, SwiGLU's fc1):
//
//   forward   {sum, normed} = residual_add_norm(residual, branch)      one kernel
//             y = normed W^T (+ b)                                      at::linear
//   backward  d_normed = dy W                                            at::mm
//             d_residual = d_branch = d_sum + norm'(d_normed), gamma's and beta's gradients
//             (and the branch's pending bias's), and normed written
//             again, bitwise the forward's                              one pass (+ a reduction)
//             W's (and b's) main gradient += dy^T normed (sum dy)       models/linear/linear_grads.h
//
// Kept from forward to backward: the sum, the norm's fp32 statistics and the parameters, as the
// unfused pair keeps them, but not the normed input (one [tokens, hidden] tensor per linear): the
// norm's backward pass rebuilds it next to its loads (models/norm/residual_norm.h, NormPrologue). The
// results are bitwise those of residual_add_norm followed by linear_with_grad_accumulation_fusion.
//
// Under tensor parallelism the norm's output enters the parallel region (an all-gather or an
// identity with an all-reduce in backward) between the two: there the modules run them apart.
#pragma once
#include <torch/torch.h>

#include "models/norm/residual_norm.h"

namespace fp8tron {

// Whether the op runs on these tensors: the norm's kernels apply (GPU, a supported dtype and
// width) and the weight's gradient is an fp32 main gradient (models/linear/fused_linear.h).
bool norm_linear_applies(const ResidualStream& in, const NormPrologue& norm, const torch::Tensor& weight,
                         const MainGrads& main_grads);

// {sum, y} as above, for residual (and branch, may be undefined) [..., in], weight [out, in],
// bias [out] or undefined. Only where norm_linear_applies.
ResidualOutput norm_linear(const ResidualStream& in, const NormPrologue& norm, const torch::Tensor& weight,
                           const torch::Tensor& bias, const MainGradsPtr& main_grads);

}  // namespace fp8tron
