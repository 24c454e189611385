// SwiGLU of an fc1 output x = [gate | up] along the last dimension ([..., 2f], the gate half first):
// silu(gate) * up, [..., f]. The activation of the dense MLP's and the experts' bf16 / fp16 / fp32
// path (the FP8 path fuses it into the cast of fc2's input instead, fp8/fp8_linear.h).
//
// On a GPU one kernel computes it, and one kernel computes both halves of its gradient straight
// into the [..., 2f] gradient of x from x alone: fp32 math, one rounding per stored value. The
// unfused chain (silu, mul; in backward mul's two gradients, silu_backward and the cat that is
// chunk's backward) ran five kernels, kept silu(gate) for backward and rounded silu(gate) to the
// activation's dtype before the product, so in bf16 the two differ by about one bf16 step. On
// the CPU, and for other dtypes, the op is that unfused chain.
#pragma once
#include <torch/torch.h>

#include "models/linear/main_grads.h"

namespace fp8tron {

torch::Tensor fused_swiglu(const torch::Tensor& x);

// linear(fused_swiglu(x), weight, bias), the dense MLP's fc2 on one rank, saving x alone for the
// backward (torch.compile keeps the same): the backward's SwiGLU pass writes fc2's input again, bit
// for bit, for the weight gradient, instead of keeping one [tokens, f] tensor per layer from the
// forward (2 GB at the LLaMA-style 1.1B). On a GPU where gradient-accumulation fusion applies to
// the weight (models/linear/fused_linear.h: its gradients go into the fp32 main gradients the same way);
// elsewhere the two ops.
torch::Tensor swiglu_linear(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias,
                            const MainGradsPtr& main_grads);

// The gradient of x = [gate | up] from the gradient of fused_swiglu(x), outside autograd: the FP8
// path's SwiGLU (fused into fc2's input cast) runs its backward through this (given to the FP8
// engine by the modules, fp8/swiglu_backward.h). One kernel on a GPU as above; elsewhere torch's chain.
torch::Tensor fused_swiglu_backward(const torch::Tensor& grad, const torch::Tensor& x);

// The unfused chain: silu(gate) * up through torch's autograd (the CPU path, the GPU reference).
torch::Tensor unfused_swiglu(const torch::Tensor& x);

}  // namespace fp8tron
