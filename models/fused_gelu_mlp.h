// The dense bf16 GeLU MLP with fc1's bias and GeLU in its GEMM's cuBLASLt epilogue (fp8/gemm.h,
// GemmActivation), as Transformer Engine's LayerNormMLP runs it:
//
//   forward   fc1        G = gelu(X W1^T + b1), Pre = X W1^T + b1     one GEMM (GELU_AUX_BIAS)
//             fc2        Y = G W2^T (+ b2)                           at::linear, as the unfused path
//   backward  fc2 dgrad  dPre = gelu'(Pre) * (dY W2)                 at::mm, then torch's gelu_backward
//             fc2 wgrad  W2's main gradient += dY^T G (and b2's += sum dY: BGRADB, one GEMM)
//             fc1        dX = dPre W1; W1's main gradient += dPre^T X (b1's += sum dPre: BGRADB)
//
// (without a bias GELU_AUX). The unfused chain — linear_with_grad_accumulation_fusion,
// at::gelu(h, "tanh"), linear — runs the GeLU as one more kernel over the [tokens, ffn]
// activations. cuBLASLt's backward epilogue (DGELU_BGRAD, which gemm() offers and its GPU tests
// check) is not used: on an H200 it ran as a separate generic epilogue kernel after the GEMM, 0.61
// ms per GPT 1.3B layer against 0.11 ms for gelu_backward. The same memory is kept for backward:
// X, Pre (the unfused chain's fc1 output) and G (fc2's input).
//
// Same math, different rounding: the epilogue applies GeLU to the fp32 accumulator (the unfused
// chain to fc1's output rounded to bf16), so G differs from the unfused chain's by about one bf16
// step. Weight and bias gradients go into their fp32 main gradients as in models/fused_linear.h;
// a bias without a main gradient gets its gradient through autograd.
//
// x is fc1's GEMM input (normed, and gathered or copied into the tensor-parallel region: the
// caller's); the result is fc2's partial output, to be reduced over the tensor-parallel group by
// the caller, with fc2_bias only where one rank holds the whole sum (TERowParallelLinear).
// Recomputation replays it like any op (it reads no state besides its inputs).
#pragma once
#include <torch/torch.h>

#include <string>

namespace fp8tron {

struct GeluMlpParams {
  torch::Tensor fc1_weight, fc1_bias;  // [ffn, in], [ffn] (undefined: none)
  torch::Tensor fc2_weight, fc2_bias;  // [out, ffn], [out] (undefined: none)
};

// Why the fused MLP cannot run on these tensors ("" when it can): gradient-accumulation fusion
// off (--no-gradient-accumulation-fusion), not bf16, a weight without an fp32 main gradient, an
// fc1 output width (per rank) cuBLASLt's GeLU aux matrix does not take (a multiple of 8), no
// tokens, or not on a GPU (there is no CPU implementation: the CPU runs the unfused chain).
std::string fused_gelu_mlp_blocker(const torch::Tensor& x, const GeluMlpParams& params);

// fc2(gelu_tanh(fc1(x))) as above, x [..., in] -> [..., out]. Only where the blocker is "".
torch::Tensor fused_gelu_mlp(const torch::Tensor& x, const GeluMlpParams& params);

}  // namespace fp8tron
