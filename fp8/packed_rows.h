// Rows quantized once, before they travel: the tokens of a mixture-of-experts layer cast to FP8 on
// the rank that routes them, so that the dispatch all-to-all moves FP8 codes and their scales
// instead of bf16 (--moe-dispatch-fp8, an fp8tron flag). The receiving experts' first grouped GEMM
// (fc1) then runs on those codes as received: nothing is quantized twice in the forward pass.
//
// Only the per-block recipes qualify: their input cast is row-local (blockwise: one fp32 scale per
// 1x128 run along a token's features; MXFP8: one E8M0 scale per 1x32 run), so a token quantized
// alone on the sender gets exactly the codes and scales the grouped cast of quantized_tensor.h
// gives it on the receiver, in whatever segment and at whatever padding. (Per-tensor recipes take
// one scale per expert over all of its tokens, from every sender: not row-local.)
//
// A packed row is one token's bytes, [ cols codes | the row's scales ], the scales as their bytes
// (fp32 little-endian, 4 each, for blockwise; one E8M0 byte each for MXFP8), so that any row
// operation (the permutation, the all-to-all, the expert tensor-parallel all-gather, the chunk
// sort) moves a token's codes and scales together. Per token of H features: H + 4 ceil(H / 128)
// bytes (blockwise) or H + ceil(H / 32) bytes (MXFP8), against 2 H in bf16: 0.516x at H = 4096.
//
// The wgrad GEMM of the receiving experts needs the transposed (column-wise) copy of their input,
// whose blocks run along the tokens: 128 (blockwise) or 32 (MXFP8) tokens of one feature, tokens
// that came from several senders, so no sender can quantize it. The receiver quantizes it from the
// dequantized received codes (DeepSeek-V3's dequantize -> transpose -> re-quantize of its FP8
// dispatch). That copy, and so the experts' fc1 weight gradients, differ from a bf16 dispatch's,
// which quantizes the transposed copy from the bf16 tokens: everything else of the step (the
// forward, every input gradient, every other weight gradient) is bitwise the bf16 dispatch's.
#pragma once
#include <torch/torch.h>

#include <memory>
#include <vector>

#include "fp8/quantized_tensor.h"

namespace fp8tron::fp8 {

// Whether the recipe's forward input cast is row-local (blockwise 1x128, MXFP8 1x32): the recipes
// whose tokens can be quantized before they are dispatched.
bool quantizes_rows_alone(const Recipe& recipe);

// The bytes of one packed row of `cols` features.
struct PackedRowLayout {
  ScalingMode mode = ScalingMode::kBlock1x128;
  Format format = Format::kE4M3;
  int64_t cols = 0;
  int64_t scales = 0;       // scales per row: ceil(cols / 128) or ceil(cols / 32)
  int64_t scale_bytes = 4;  // fp32 (blockwise) or E8M0 (MXFP8)
  int64_t row_bytes() const { return cols + scales * scale_bytes; }
};
PackedRowLayout packed_row_layout(const Recipe& recipe, int64_t cols);  // UserError for per-tensor recipes

// The sender: x2d [rows, cols] (rounded to bf16 first, as every cast reads bf16) quantized as the
// forward input of a linear, one packed row per row: uint8 [rows, row_bytes]. GPU: the grouped
// cast kernel of quantize.h over one segment; CPU: its reference. Bit for bit the row-wise copy
// and scales quantize_grouped gives these rows.
torch::Tensor quantize_packed_rows(Fp8Engine& e, const torch::Tensor& x2d);

// The values packed rows stand for, decode(code) x scale_inv: [rows, cols], fp32 on the CPU and
// bf16 on a GPU (the dequantized copies of the emulated and CPU paths, bit for bit).
torch::Tensor dequantize_packed_rows(Fp8Engine& e, const torch::Tensor& packed, int64_t cols);

// The receiver: the grouped forward input of `sites` (one per segment, rows[e] rows each, packed
// rows grouped by segment) as quantize_grouped(kInput) lays it out, its row-wise copy being the
// received codes and scales (zero codes in the alignment padding, whose scales are those of a zero
// block); the dequantized row-wise copy on the emulated and CPU paths; with `transposed`, the
// transposed copy quantized from `values` (dequantize_packed_rows of the same rows, as the layer
// got them).
std::shared_ptr<QuantizedSegments> quantize_grouped_from_packed(Fp8Engine& e, const std::vector<Fp8Site*>& sites,
                                                                const torch::Tensor& packed, const torch::Tensor& values,
                                                                const std::vector<int64_t>& rows, bool transposed);

}  // namespace fp8tron::fp8
