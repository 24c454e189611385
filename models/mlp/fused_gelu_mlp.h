// The dense bf16 GeLU MLP, fc1's bias in its GEMM's cuBLASLt epilogue and the GeLU in our kernels
// (models/mlp/gelu_kernels.h):
//
//   forward   fc1        Pre = X W1^T + b1                           at::linear (bias epilogue)
//             GeLU       G = gelu(Pre)                               one kernel; G is not saved
//             fc2        Y = G W2^T (+ b2)                           at::linear
//   backward  fc2 dgrad  dG = dY W2                                  at::mm
//             GeLU       dPre = gelu'(Pre) * dG (in place), G = gelu(Pre) again,
//                        b1's gradient = sum dPre over tokens        one kernel
//             fc2 wgrad  W2's main gradient += dY^T G (and b2's += sum dY: BGRADB, one GEMM,
//                        unless the caller left b2 to the next norm: no b2 given)
//             fc1        dX = dPre W1; W1's main gradient += dPre^T X
//
// Saved for backward: X and Pre, as torch.compile keeps them; G (fc2's input, one [tokens, ffn]
// tensor per layer) is recomputed bit for bit inside the backward pass that reads Pre anyway.
// Megatron's --bias-gelu-fusion fuses bias and GeLU in one kernel; here the bias rides in fc1's
// GEMM. cuBLASLt's GELU_AUX_BIAS epilogue (fp8/gemm.h, GemmActivation) would apply GeLU to the
// fp32 accumulator, so the backward could not reproduce G from Pre; it breaks even with the
// separate kernel at 1.3B and is not used. Nor is its DGELU_BGRAD backward epilogue: on an H200
// it ran as a separate generic kernel, 0.61 ms per GPT 1.3B layer against 0.11 ms for
// gelu_backward. Weight and bias gradients go into their fp32 main gradients as in
// models/linear/fused_linear.h (written by a step's first write, models/linear/main_grads.h); a bias
// without a main gradient gets its gradient through autograd.
//
// fused_norm_gelu_mlp runs fc1's norm (with the residual stream's pending add) in the same op,
// TE's LayerNormMLP: x, the norm's output, is then not kept either; the norm's backward pass
// writes it again, bitwise, for fc1's wgrad (models/norm/residual_norm.h, NormPrologue). That is one
// [tokens, hidden] tensor less per layer, and the results are bitwise the separate norm's.
//
// x is fc1's GEMM input (normed, and gathered or copied into the tensor-parallel region: the
// caller's); the result is fc2's partial output, to be reduced over the tensor-parallel group by
// the caller, with fc2_bias only where one rank holds the whole sum (TERowParallelLinear).
// Recomputation replays it like any op (it reads no state besides its inputs).
#pragma once
#include <torch/torch.h>

#include <string>

#include "models/linear/main_grads.h"
#include "models/norm/residual_norm.h"

namespace fp8tron {

struct GeluMlpParams {
  torch::Tensor fc1_weight, fc1_bias;  // [ffn, in], [ffn] (undefined: none)
  torch::Tensor fc2_weight, fc2_bias;  // [out, ffn], [out] (undefined: none)
  MainGradsPtr main_grads;             // the model's (models/linear/main_grads.h)
};

// Why the fused MLP cannot run on these tensors ("" when it can): gradient-accumulation fusion
// off (--no-gradient-accumulation-fusion), not bf16, a weight without an fp32 main gradient, an
// fc1 output width (per rank) that is not a multiple of 8 (the kernels' 16-byte packs), no
// tokens, or not on a GPU (there is no CPU implementation: the CPU runs the unfused chain).
std::string fused_gelu_mlp_blocker(const torch::Tensor& x, const GeluMlpParams& params);

// fc2(gelu_tanh(fc1(x))) as above, x [..., in] -> [..., out]. Only where the blocker is "".
torch::Tensor fused_gelu_mlp(const torch::Tensor& x, const GeluMlpParams& params);

// {sum, the MLP of norm(sum)}, sum = in.residual + in.branch: one rank's MLP whose fc1 reads the
// norm directly (no tensor-parallel region between them). Only where the blocker (of in.residual)
// is "" and norm_prologue_applies.
ResidualOutput fused_norm_gelu_mlp(const ResidualStream& in, const NormPrologue& norm, const GeluMlpParams& params);

}  // namespace fp8tron
