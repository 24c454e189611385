// The dense bf16 GeLU MLP with the GeLU in its GEMMs' cuBLASLt epilogues (fp8/gemm.h,
// GemmActivation), Transformer Engine's LayerNormMLP scheme on fp8tron's GEMM wrapper:
//
//   forward   fc1        G = gelu(X W1^T + b1), Pre = X W1^T + b1     one GEMM (GELU_AUX_BIAS)
//             fc2        Y = G W2^T (+ b2)                           at::linear, as the unfused path
//   backward  fc2 dgrad  dPre = (dY W2) * gelu'(Pre), db1 = sum dPre  one GEMM (DGELU_BGRAD)
//             fc2 wgrad  W2's main gradient += dY^T G (and b2's += sum dY: BGRADB, one GEMM)
//             fc1        dX = dPre W1; W1's main gradient += dPre^T X
//
// (without biases GELU_AUX and DGELU). The unfused chain — linear_with_grad_accumulation_fusion,
// at::gelu(h, "tanh"), linear — runs two more kernels over the [tokens, ffn] activations in each
// direction (the GeLU and its backward: 1.6 ms of a GPT-2 124M step and 4.5 ms of a 1.3B step on
// an H200, docs/benchmarks.md). The same memory is kept for backward: X, Pre (the unfused chain's
// fc1 output) and G (fc2's input).
//
// Same math, different rounding: the epilogue applies GeLU to the fp32 accumulator (the unfused
// chain to fc1's output rounded to bf16) and its derivative to the fp32 product dY W2 (the unfused
// chain to it rounded to bf16), so G and dPre differ from the unfused chain's by about one bf16
// step. fc1's bias gradient comes from the dgrad epilogue in bf16 — cuBLASLt writes a bias gradient
// in the output's type (fp8/gemm.h) — and is added in fp32 into the bias's main gradient (the
// unfused chain sums the bf16 dPre in fp32 in fc1's wgrad GEMM); Megatron with Transformer Engine
// produces it in bf16 too. Weight gradients go into their fp32 main gradients as in
// models/fused_linear.h; a bias without a main gradient gets its gradient through autograd.
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
