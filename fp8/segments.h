// A grouped tensor: the rows of several GEMMs stacked, segment e's rows contiguous (the tokens of
// a mixture-of-experts layer permuted by expert, m_splits[e] rows for expert e), and the layout of
// its quantized copies.
//
// FP8 GEMMs need every operand's token count to be a multiple of an alignment (16; 32 for
// MXFP8's 1x32 blocks along tokens, Megatron's get_fp8_align_size), because the wgrad reduces over
// tokens and reads the transposed copies, whose leading dimension is the token count. Megatron/TE
// pad each expert's rows with zero rows to that alignment inside the expert module (Fp8Padding).
// Here the padding exists only in the quantized copies, written by the same pass that quantizes:
//   data     [total_padded, cols]: segment e at rows [row_begin_e, row_begin_e + padded_e), its
//            source rows followed by padded_e - rows_e rows of zero codes
//   data_t   segment e as its own [cols, padded_e] matrix (the wgrad operand) at element offset
//            cols * row_begin_e, zero codes in the padding columns
//   scales   tensor scaling: one per segment, 16 bytes apart (scale_inv[4 e]); block modes: segment e's scale grid
//            (fp8_tensor.h's layout for a [padded_e, cols] tensor, resp. [cols, padded_e]) at
//            element scale_begin_e (scale_t_begin_e for data_t), every grid 16-byte aligned
// Zero rows change no amax and no block scale, and contribute nothing to a product, so segment e
// quantizes exactly as expert e's rows padded with zeros would on their own: the per-segment
// CPU reference checks that bit for bit.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "fp8/fp8_tensor.h"

namespace fp8tron::fp8 {

// round_up(rows, align); 0 stays 0 (an expert without tokens has no GEMM).
inline size_t padded_rows(size_t rows, size_t align) { return round_up(rows, align); }

// Floats between consecutive segments' tensor scales (16 bytes: cuBLASLt's scale-pointer alignment).
constexpr size_t kTensorScaleStride = 4;

struct SegmentLayout {
  ScalingMode mode = ScalingMode::kTensor;
  size_t cols = 0;
  std::vector<size_t> rows, padded;  // per segment
  // Prefix sums, one entry more than there are segments: source rows, padded rows, 128-row tiles
  // of the padded rows, elements of the row-wise and transposed scale grids.
  std::vector<size_t> src_begin, row_begin, tile_begin, scale_begin, scale_t_begin;

  size_t segments() const { return rows.size(); }
  size_t total_rows() const { return src_begin.back(); }
  size_t total_padded() const { return row_begin.back(); }
  size_t scale_elements() const { return scale_begin.back(); }
  size_t scale_t_elements() const { return scale_t_begin.back(); }
  bool padding() const { return total_rows() != total_padded(); }
};

// rows: the token count of each segment (>= 0); align: 16 or 32 (a multiple of 16).
SegmentLayout make_segment_layout(ScalingMode mode, size_t cols, const std::vector<int64_t>& rows, size_t align);

// The quantized copies of a grouped tensor (pointers into memory the caller owns).
struct SegmentedFp8View {
  void* data = nullptr;         // [total_padded, cols] or null
  void* data_t = nullptr;       // per-segment transposed copies, or null
  void* scale_inv = nullptr;    // tensor: fp32 [segments]; blocks: the row-wise grids (fp32, or E8M0 bytes)
  void* scale_inv_t = nullptr;  // blocks: the transposed copies' grids
  // Tensor scaling: segment e's scale is scale[e * scale_stride] (delayed: read; current: written,
  // may be null) and its amax amax[e * amax_stride] (delayed: max-accumulated, may be null;
  // current: written, stride 1). The strides let delayed scaling point into the engine's slots.
  float* scale = nullptr;
  size_t scale_stride = 1;
  float* amax = nullptr;
  size_t amax_stride = 1;
  Format format = Format::kE4M3;
  ScalingMode scaling_mode = ScalingMode::kTensor;
};

// Segment e as a plain quantized tensor [padded_e, cols]: the operand of its GEMMs.
Fp8TensorView segment_view(const SegmentedFp8View& t, const SegmentLayout& layout, size_t e);

}  // namespace fp8tron::fp8
