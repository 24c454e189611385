// Quantization kernels: bf16 -> 8-bit codes with per-tensor, blockwise or MXFP8 scales, fused
// with the amax reduction and with the transposed copy that Hopper's FP8 GEMMs need (they only
// take "TN" operands: see gemm.h). Raw device pointers and a stream; no CUDA headers here, so C++
// callers include this without nvcc. bf16 values are passed as their uint16_t bit patterns.
//
// Every function has a CPU twin with identical results in quantize_reference.h; the GPU tests
// check them bit for bit.
//
// Shapes: x is [rows, cols] row-major. Writing data_t (the [cols, rows] transposed copy) and every
// block-scaled mode need rows % 16 == 0 and cols % 16 == 0 (FP8 GEMM leading dimensions must be
// multiples of 16 anyway; pad otherwise) and 16-byte aligned pointers. The row-wise-only tensor
// casts take any size.
//
// Element values: q = convert(x * scale) in fp32, round-to-nearest-even and saturating to +-max for
// E4M3/E5M2 (PTX cvt.rn.satfinite), round-half-away and saturating for HiF8. Dequantization:
// y = bf16(decode(q) * scale_inv), round-to-nearest-even.
#pragma once
#include <cstddef>
#include <cstdint>

#include "fp8/fp8_tensor.h"
#include "fp8/segments.h"

struct CUstream_st;

namespace fp8tron::fp8 {

using CudaStream = CUstream_st*;

struct CurrentScalingOptions {
  bool power_2_scales = false;
  float amax_epsilon = 0.0f;
};

// Fusions of the per-tensor casts (b) and (c), so that activations and gradients are read once:
//   prologue     an elementwise function applied to x first: kGeluTanh quantizes
//                bf16(gelu_tanh(x)) (torch's tanh approximation in fp32, rounded to bf16), the
//                GeLU output of an MLP never stored in bf16; kGeluTanhBackward quantizes
//                bf16(x * gelu_tanh'(aux)) (torch's gelu_backward), the gradient of the GeLU's
//                input from the gradient of its output x and its input aux (same shape);
//   column_sums  fp32 [cols], zeroed by the caller: the kernel adds the column sums of the
//                (post-prologue) values, i.e. a linear layer's bias gradient from its output
//                gradient. Atomic adds: the summation order varies between runs. Needs data_t
//                (the tile kernel).
//                kLayerNorm quantizes bf16(gamma[c] * (rstd[r] * (x - mean[r])) + beta[c]), a
//                LayerNorm's (mean and beta null: RMSNorm's) output from its input and row
//                statistics (norm_row_stats): the
//                norm of TELayerNormColumnParallelLinear fused into the cast. kLayerNorm runs in
//                the tile kernel (data_t given) with delayed (given) scales only.
//                kSwiglu quantizes bf16(bf16(silu(x[r, c])) * x[r, c + cols]) from x [rows, 2 cols]
//                (row stride 2 cols: the gate and up halves of a SwiGLU fc1 output), rounding as
//                torch's silu(gate) * up; tile kernel, delayed scales.
//                kSwigluBackward quantizes the gradient of a SwiGLU's input h = [gate | up]
//                (aux, bf16 [rows, cols]) from the gradient x of its output (bf16 [rows, cols / 2],
//                row stride cols / 2): column c < cols / 2 is bf16(silu'(gate) * (x * up)), column
//                cols / 2 + c is bf16(x * silu(gate)), as models/mlp/swiglu_kernels.h's backward
//                computes them. fc1's gradient cast of a SwiGLU MLP: the bf16 gradient of h is
//                never stored. Tile kernel, delayed scales, cols % 256 == 0 (each half whole
//                128-column tiles).
//                Both SwiGLU prologues evaluate silu with the fast exponential and reciprocal
//                (fp8/silu_math.cuh): within one bf16 step of torch's formulas.
enum class Prologue : uint8_t { kNone, kGeluTanh, kGeluTanhBackward, kLayerNorm, kSwiglu, kSwigluBackward };
struct NormPrologue {
  const float* mean = nullptr;       // [rows]; null for RMSNorm (mean 0)
  const float* rstd = nullptr;       // [rows]
  const uint16_t* gamma = nullptr;   // bf16 [cols], 16-byte aligned
  const uint16_t* beta = nullptr;    // bf16 [cols] or null
};
struct TensorCastFusion {
  Prologue prologue = Prologue::kNone;
  float* column_sums = nullptr;
  const uint16_t* aux = nullptr;  // kGeluTanhBackward: the GeLU input, bf16 [rows, cols]; kSwigluBackward: h
  NormPrologue norm;              // kLayerNorm
};

// Norm row statistics of x [rows, cols] (bf16) in fp32, as torch computes them: LayerNorm (mean
// non-null) mean and rstd = 1 / sqrt(biased variance + eps); RMSNorm (mean null) rstd =
// 1 / sqrt(mean of squares + eps). One warp per row. cols % 8 == 0.
void norm_row_stats(const uint16_t* x, size_t rows, size_t cols, float eps, float* mean, float* rstd, CudaStream stream);

// (c') The cast of (c) with the amax already in *out.amax (not recomputed): the amax of a larger
// tensor that x is a part of, e.g. this rank's sequence shard of a tensor-parallel all-gather whose
// shards' amaxes were MAX-reduced, so the shard's codes and scale equal those of casting the
// whole. One pass over x.
void quantize_tensor_current_given_amax(const uint16_t* x, const Fp8TensorView& out, const CurrentScalingOptions& options,
                                        CudaStream stream);

struct BlockScalingOptions {
  bool power_2_scales = true;  // TE's default for the blockwise recipe
  float amax_epsilon = 0.0f;
};

// (a) *amax = max(*amax, max |x[i]|) over n bf16 values (block reduction, then one atomicMax on the
// float's bits per block). The amax rule of scale_math.h holds for every amax in this file (tensor,
// block and MX amaxes alike): NaN elements (quiet or signaling) are ignored, as by fmaxf and
// Transformer Engine; an inf element makes the amax +inf. Zero *amax first for a fresh reduction.
void amax_bf16(const uint16_t* x, size_t n, float* amax, CudaStream stream);

// (b) Delayed (per-tensor, given scale) cast. out: scaling_mode kTensor, format E4M3, E5M2 or HiF8;
// reads *out.scale; writes out.data and/or out.data_t (each may be null), *out.scale_inv = 1/scale
// when non-null, and max-accumulates |x| into *out.amax when non-null (the delayed-scaling
// history slot), all in one pass over x.
void quantize_tensor_delayed(const uint16_t* x, const Fp8TensorView& out, CudaStream stream,
                             const TensorCastFusion& fusion = {});

// (c) Current (tensorwise) scaling: *out.amax = max |x| (out.amax is required; it is zeroed here),
// then scale = scale_from_amax(amax, fp8_max, options) computed on the device; writes *out.scale
// (when non-null), *out.scale_inv and the codes. Two passes over x (amax, then cast).
void quantize_tensor_current(const uint16_t* x, const Fp8TensorView& out, const CurrentScalingOptions& options,
                             CudaStream stream, const TensorCastFusion& fusion = {});

// (d) Block scaling, mode kBlock1x128 or kBlock128x128 (E4M3 or E5M2): writes data + scale_inv
// and/or data_t + scale_inv_t in the layouts of fp8_tensor.h (cuBLASLt's VEC128_32F /
// BLK128x128_32F). For 1x128 the transposed copy is quantized from x with its own 1x128 blocks
// along the rows of x; for 128x128 both copies share the block scales.
void quantize_blockwise(const uint16_t* x, const Fp8TensorView& out, const BlockScalingOptions& options,
                        CudaStream stream);

// (e) MXFP8: 1x32 blocks along the rows of x with E8M0 scales (data + scale_inv), and/or the
// transposed copy with 1x32 blocks along the rows of x^T (data_t + scale_inv_t). Scale of a block:
// the smallest power of two s with amax / s <= fp8_max (TE's rule).
void quantize_mxfp8(const uint16_t* x, const Fp8TensorView& out, CudaStream stream);

// (g) Grouped tensors (segments.h): x [total_rows, cols] bf16, segment e's rows at src_begin_e,
// quantized in one pass over x (current scaling: two, amaxes then codes) into the padded layout,
// each segment with its own scales, exactly as that segment alone, padded with zero rows, would be
// quantized by (b)-(e): that is the CPU reference, bit for bit. out.scaling_mode must be the
// layout's and match the kind: kDelayed / kCurrent tensor scaling (E4M3, E5M2, HiF8), kBlockwise
// 1x128 or 128x128, kMxfp8. cols % 16 == 0 and 16-byte aligned pointers.
struct SegmentCast {
  enum class Kind : uint8_t { kDelayed, kCurrent, kBlockwise, kMxfp8 };
  Kind kind = Kind::kDelayed;
  CurrentScalingOptions current;
  BlockScalingOptions block;
  // Per-tensor kinds: fp32 [segments][cols], zeroed by the caller; adds segment e's column sums
  // (a linear layer's bias gradients from its output gradient) into row e. Atomic adds: the
  // summation order varies between runs.
  float* column_sums = nullptr;
  // kNone, or (kDelayed with the transposed copies only) the SwiGLU prologues, each segment as the
  // per-tensor cast with that prologue computes it:
  //   kSwiglu          x is [total_rows, 2 cols], each row the [gate | up] halves of a SwiGLU fc1
  //                    output; quantizes silu(gate) * up (an MoE fc2's input: the activation is
  //                    never stored in bf16)
  //   kSwigluBackward  x is [total_rows, cols / 2], the gradient of the SwiGLU's output, and aux
  //                    [total_rows, cols] its input h; quantizes the gradient of h (an MoE fc1's
  //                    output gradient: never stored in bf16). cols % 256 == 0.
  Prologue prologue = Prologue::kNone;
  const uint16_t* aux = nullptr;
};
void quantize_segments(const uint16_t* x, const SegmentLayout& layout, const SegmentedFp8View& out,
                       const SegmentCast& cast, CudaStream stream);

// (f) Dequantize the row-wise copy (transposed_copy = false, y is [rows, cols]) or the transposed
// copy (y is [cols, rows]) to bf16, for every format and scaling mode.
void dequantize(const Fp8TensorView& in, bool transposed_copy, uint16_t* y, CudaStream stream);

}  // namespace fp8tron::fp8
