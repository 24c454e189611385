// The parameter gradients of a bf16/fp16 linear y = x W^T (+ b) under gradient-accumulation
// fusion (models/linear/fused_linear.h): the weight gradient is accumulated by its GEMM in fp32 straight
// into the parameter's main gradient (the optimizer's flat fp32 buffer, which `.grad` views) when
// it has one; the bias gradient too, by the same GEMM call (cuBLASLt's BGRADB epilogue), when both
// have one and the tensors are bf16. Shared by the fused linear and the fused GeLU MLP
// (models/mlp/fused_gelu_mlp.h), whose backward passes call these on [tokens, features] matrices.
#pragma once
#include <torch/torch.h>

#include "models/linear/main_grads.h"

namespace fp8tron {

// Whether the parameter's gradient is such a buffer: fp32, contiguous, the parameter's shape.
bool is_main_grad(const torch::Tensor& param);

// What autograd is still to receive: undefined where a gradient went into its main gradient, or
// was not wanted.
struct LinearParamGrads {
  torch::Tensor weight, bias;
};

// dW = dY^T X and db = sum of dY over tokens, for dy [tokens, out], x [tokens, in], weight
// [out, in] and bias [out] (undefined: none). want_*: autograd's needs_input_grad. `main_grads`:
// the model's (first writes; null: none).
LinearParamGrads linear_param_grads(const torch::Tensor& dy, const torch::Tensor& x, const torch::Tensor& weight,
                                    const torch::Tensor& bias, bool want_weight, bool want_bias,
                                    const MainGradsPtr& main_grads);

// Where one of our kernels puts a bias's gradient, summed in fp32 over tokens: the bias's fp32
// main gradient (written in the step's first write, models/linear/main_grads.h, else added to), or
// a new fp32 tensor for autograd. `grad` undefined: no bias.
struct BiasGradTarget {
  torch::Tensor grad;
  bool accumulate = false, into_main_grad = false;
};
// None unless `wanted` (autograd's needs_input_grad). Ask only where the gradient will be written:
// it claims the step's first write.
BiasGradTarget bias_grad_target(const torch::Tensor& bias, bool wanted, const MainGradsPtr& main_grads);
// What autograd gets for the bias afterwards: undefined where it went into the main gradient.
torch::Tensor bias_grad_for_autograd(const torch::Tensor& bias, const BiasGradTarget& target);

// `grad` added (in fp32) into the parameter's main gradient when it has one (undefined returned),
// else returned for autograd.
torch::Tensor into_main_grad_or_return(const torch::Tensor& param, const torch::Tensor& grad);

}  // namespace fp8tron
