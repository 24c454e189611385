// The backward of the SwiGLU that fp8_linear fuses into its input's cast (Prologue::kSwiglu): the
// gradient of fc1's output h = [gate | up] ([rows, 2f]) from the gradient of silu(gate) * up
// ([rows, f]). torch's ops (silu_backward, two muls, the cat; five kernels and bf16 temporaries)
// unless the engine is given a faster one (Fp8Engine::use_backward_kernels). The models library
// gives its fused kernel (models/mlp/fused_swiglu.h), which fp8/ cannot link against: fp8/ sits
// below models/ in the layering. That function must be a drop-in: the same gradient to within
// rounding, for any input; it falls back to torch_swiglu_backward itself where its kernel does not
// apply.
#pragma once
#include <torch/torch.h>

namespace fp8tron::fp8 {

using SwigluBackwardFn = torch::Tensor (*)(const torch::Tensor& grad, const torch::Tensor& h);


// torch's ops: cat(silu_backward(grad * up, gate), grad * silu(gate)).
torch::Tensor torch_swiglu_backward(const torch::Tensor& grad, const torch::Tensor& h);

// The forward in torch's ops: silu(gate) * up of h = [gate | up] ([..., 2f] -> [..., f]), where a
// cast cannot fuse it (Prologue::kSwiglu on the other paths).
torch::Tensor torch_swiglu(const torch::Tensor& h);

}  // namespace fp8tron::fp8
