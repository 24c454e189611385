// The grouped linear of a mixture-of-experts layer (Transformer Engine's GroupedLinear, the math of
// models/linear/grouped_linear.h's TEGroupedLinear): x [tokens, in] holds the tokens of E experts one
// after the other, m_splits[e] rows for expert e, and
//     y[rows of e] = x[rows of e] W_e^T (+ b_e),   W_e [out, in], b_e [out] or undefined.
// One autograd node for all experts; every GEMM of a pass (fprop; dgrad and wgrad together) is
// issued in one launch sequence over a few side streams (grouped_gemm.h), each expert writing its
// rows of one preallocated output (no concatenation).
//
// FP8 (sites: one Fp8Site per expert, registered one after the other): each expert is its own FP8
// site with its own scaling state, exactly as one fp8_linear per expert, but the input (forward)
// and the output gradient (backward) are quantized for all experts in ONE pass
// (quantize_grouped). Every recipe:
//   native    delayed, tensorwise (E4M3 / hybrid) and blockwise (1x128 activations and gradients,
//             128x128 weights) on FP8 tensor cores, per-expert cuBLASLt GEMMs on the side streams
//   emulated  MXFP8 on Hopper and HiF8: the same quantization, dequantized, bf16 GEMMs per expert
//   cpu       reference quantizers, fp32 GEMMs per expert (the CPU tests check the math here)
// Token counts that are not a multiple of the recipe's alignment (16; 32 for MXFP8) are padded
// inside, as Megatron/TE's Fp8Padding pads each expert's rows with zero rows: the padding exists in
// the quantized copies only (written by the quantize pass), so it changes no amax, no output and no
// gradient. Results equal one fp8_linear per expert on its rows padded with zero rows, the padding
// rows of the output dropped (bit for bit on the CPU). On the native path tensor-scaled fprop and
// dgrad GEMMs run the exact rows (rows are independent); block-scaled ones run the padded rows into
// a padded buffer, whose real rows are then gathered (one copy, only when some count is unaligned).
//
// bf16 (sites empty): per expert addmm on the CPU (bit for bit F::linear's forward and backward);
// on the GPU per-expert GEMMs on the side streams through cuBLASLt (bucketed plans: no host-side
// heuristics per token count), or at::mm when `bf16_backend` asks for it (tests, benchmarks).
// Wgrad always runs through cuBLASLt, adding into the fp32 main gradient when the weight has one.
//
// Gradients: the weight gradient of an expert goes straight into its fp32 main gradient on the GPU
// (gradient-accumulation fusion, as fp8_linear; FP8 sites overwrite it in a step's first backward
// when the engine says so), otherwise it is returned. An expert without tokens runs no GEMM but
// its weight and bias still get a gradient, zero (returned when the parameter has none yet; with
// an overwritten main gradient, cleared in the step's first backward), so the autograd graph does
// not depend on the routing. No device-to-host synchronisation: the token counts are host values.
//
// `wgrad_queue` (--delay-wgrad-compute, fp8/held_wgrad.h): the backward pass runs the dgrad GEMMs
// (and the bias gradients) and holds the wgrad GEMMs of every expert, from the same quantized
// copies, in one closure the queue runs later; the gradients are bitwise those computed at once.
#pragma once
#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <vector>

#include "core/deferred_work.h"
#include "fp8/fp8_linear.h"

namespace fp8tron::fp8 {

// The bf16 experts' fprop and dgrad GEMMs: cuBLASLt where the operands allow it (bf16 on a GPU),
// else at::mm; kAtenMm forces at::mm (comparisons in tests and benchmarks).
enum class Bf16GroupedBackend : uint8_t { kCublasLt, kAtenMm };

// prologue kSwiglu (an MoE layer's fc2): x is [tokens, 2 in], the SwiGLU fc1 outputs [gate | up],
// and the GEMMs read silu(gate) * up. FP8 sites: the SwiGLU runs inside the input's grouped cast
// where grouped_linear_fuses_swiglu (its bf16 output is never stored: one read of x, no write),
// with torch's ops before the cast elsewhere; the backward applies fp8::swiglu_backward to the
// dgrad output, unless x is the output of another FP8 grouped_linear (fc1) with the same token
// counts: that node then applies SwiGLU's backward inside its gradient cast (the hand-over of
// fp8_linear.h, Prologue::kSwigluBackward on native delayed scaling, first elsewhere), so the bf16
// gradient of x is never stored either; x must then have no other consumer. bf16 (no sites):
// torch's SwiGLU ops, then the grouped GEMMs.
// packed_x (an MoE layer's fc1 under --moe-dispatch-fp8): x's rows arrived already quantized, as
// packed rows (fp8/packed_rows.h: codes and per-block scales, a per-block recipe); the fprop GEMMs
// run on those codes as they are, x holding the values they stand for, from which the transposed
// copy of the wgrad is quantized. FP8 sites only, no prologue.
torch::Tensor grouped_linear(const torch::Tensor& x, const std::vector<int64_t>& m_splits,
                             const std::vector<torch::Tensor>& weights, const std::vector<torch::Tensor>& biases,
                             const std::vector<Fp8Site*>& sites,
                             Bf16GroupedBackend bf16_backend = Bf16GroupedBackend::kCublasLt,
                             Prologue prologue = Prologue::kNone, bool gradient_accumulation_fusion = true,
                             std::shared_ptr<DeferredWork> wgrad_queue = nullptr, const torch::Tensor& packed_x = {});

// Whether the grouped linear that produced h (fc1) applies the SwiGLU backward of the one that
// consumed it (fc2): the hand-over above. For tests and diagnostics; false once the backward ran.
bool grouped_hands_over_swiglu_backward(const torch::Tensor& h);

// Whether grouped_linear with these sites fuses Prologue::kSwiglu into its input's cast (native FP8
// GEMMs, delayed per-tensor scaling). False for bf16 experts (no sites).
bool grouped_linear_fuses_swiglu(const std::vector<Fp8Site*>& sites);


}  // namespace fp8tron::fp8
