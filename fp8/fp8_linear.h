// The FP8 linear layer as LibTorch sees it: an autograd node that runs a linear layer's three
// GEMMs in FP8 through its site of the model's engine (fp8_engine.h): Transformer Engine's
// fp8_autocast + Linear, without the Python.
//
//   forward   Y  = X W^T (+ b)   X quantized (row-wise for fprop, transposed copy kept for wgrad),
//                                W quantized once per optimizer step (row-wise + transposed copy,
//                                cached across micro-batches), bf16 output
//   backward  dX = dY W          dY quantized (row-wise for dgrad, transposed copy for wgrad)
//             dW = dY^T X        from the saved transposed copies; db = sum of dY
//
// With the engine's keep_transposes off (--fp8-transposes recast) the transposed copies that a
// bf16 run has no counterpart of are not kept: the weight is quantized row-wise in each forward
// pass and its transposed copy in backward, and so is x's with a GeLU or SwiGLU prologue (the node
// holds its input anyway) or where the caller can rebuild x (`rebuild_x`: a norm's output). Both come out as the kept copies would (the step's delayed scales; the
// same values' amax for current scaling; block scales of the same blocks).
//
// With the engine's fp8_wgrad off (--no-fp8-wgrad) the wgrad GEMM runs in bf16, dW = dY^T f(x),
// from the unquantized output gradient and input (neither transposed copy is cast): the node holds
// x, or makes f(x) again from what it holds anyway (the activation's input; `rebuild_x`). The GeLU
// and SwiGLU backward then run unfused, as the wgrad reads their bf16 output.
//
// Three execution paths share the quantizers' semantics (fp8/quantize.h; the CPU ones are the
// bit-identical references of quantize_reference.h):
//   native     GPU, per-tensor and blockwise recipes with E4M3/E5M2: FP8 GEMMs through cuBLASLt
//   emulated   GPU, MXFP8 on Hopper and HiF8 anywhere: quantize, dequantize to bf16, bf16 GEMM
//   cpu        quantize with the reference, dequantize to fp32, fp32 GEMM (CI tests the math here)
// fp8/'s kernels stay torch-free; this file and fp8_engine.h are the LibTorch bridge.
#pragma once
#include <torch/torch.h>

#include <functional>

#include "fp8/fp8_engine.h"
#include "fp8/quantize.h"

namespace fp8tron::fp8 {

// y = f(x) W^T + b through the site's FP8 GEMMs. x [..., in], weight [out, in], bias [out] or
// undefined. Differentiable in x, weight and bias. f is the prologue: identity, or GeLU (tanh)
// fused into the cast of x (an MLP's fc2: the GeLU output is never stored in bf16). Backward:
// when x is the output of another fp8_linear (fc1), that node applies GeLU's derivative inside its
// gradient cast, so the bf16 gradient of the GeLU input is never stored either; x must then have
// no other consumer. Otherwise this node applies it to its dgrad output. Prologue::kSwiglu: x is
// [..., 2 in] (gate half, up half) and f(x) = silu(gate) * up, fused into the cast with delayed
// scaling (elsewhere computed first). Its backward, as for GeLU: when x is the output of another
// fp8_linear (fc1), that node applies SwiGLU's derivative inside its gradient cast
// (Prologue::kSwigluBackward, native delayed scaling), x again with no other consumer; otherwise
// this node applies it to its dgrad output.
// `rebuild_x` (may be empty): returns x again, bit for bit, from what its producer keeps for its own
// backward anyway (a norm's input: models/linear/layer_norm_column_parallel_linear.cpp). With
// --fp8-transposes recast the node then holds it instead of x's transposed copy and casts that
// copy in backward from its result.
using InputRebuild = std::function<torch::Tensor()>;
torch::Tensor fp8_linear(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias, Fp8Site& site,
                         Prologue prologue = Prologue::kNone, const InputRebuild& rebuild_x = {});

// Whether the FP8 linear that produced h (fc1) applies the SwiGLU backward of the FP8 linear that
// consumed it (fc2, Prologue::kSwiglu) in its own gradient cast: the hand-over above. For tests and
// diagnostics; false once the backward has run.
bool hands_over_swiglu_backward(const torch::Tensor& h);

// Whether the FP8 linear that produced y keeps an FP8 copy of its input for its wgrad (false where
// it casts that copy again in backward from what another node keeps: --fp8-transposes recast); y
// must be an FP8 linear's output. For tests and diagnostics; false once backward ran.
bool keeps_input_copy(const torch::Tensor& y);

// norm(x) W^T + b (TE's LayerNormLinear), norm = LayerNorm, or RMSNorm when `rms` (beta unused).
// With delayed scaling on FP8 tensor cores, in training, the norm is fused into the cast of the
// GEMM input: row statistics, then one pass that normalizes, quantizes (both copies) and records
// the amax, so the bf16 norm output is never stored; backward runs the dgrad GEMM, then the norm's
// backward from the saved statistics. Elsewhere it is the norm followed by fp8_linear.
// Differentiable in x, gamma, beta, weight, bias. The modules no longer call it: on one rank the
// fused residual add + norm kernel followed by fp8_linear measured faster (models/linear/modules.cpp);
// the overlapped op fuses the norm into its shard's cast through its own kernels.
torch::Tensor fp8_norm_linear(const torch::Tensor& x, bool rms, const torch::Tensor& gamma, const torch::Tensor& beta,
                              double eps, bool zero_centered_gamma, const torch::Tensor& weight, const torch::Tensor& bias,
                              Fp8Site& site);

}  // namespace fp8tron::fp8
