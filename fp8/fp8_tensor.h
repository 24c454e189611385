// One non-owning descriptor for a quantized tensor, as Transformer Engine's: the codes (row-wise
// copy and, when a GEMM needs the other operand layout, a transposed copy), the scale the quantizer
// multiplied by, the dequantization factors (scale_inv) and the amax slot. Memory is owned by the
// caller (torch tensors in models/, std::vectors in tests); the pointers are device pointers for the
// CUDA kernels and host pointers for the CPU reference.
//
// Conventions used throughout fp8/:
//   * A logical tensor is 2-D, [rows, cols], row-major (cols contiguous). Higher-rank activations
//     are flattened to rows = prod(leading dims).
//   * data   holds the [rows, cols] codes, row-major.
//   * data_t holds the codes of the transpose, [cols, rows], row-major. For block scaling it is
//     quantized from the high-precision input with its own blocks (so it is not the transpose of
//     data's codes, except for 128x128 blocks, whose scales are shared).
//   * scale_inv / scale_inv_t follow scale_layout(mode, rows, cols) / scale_layout(mode, cols, rows).
#pragma once
#include <cstddef>
#include <cstdint>

#include "fp8/formats.h"

namespace fp8tron::fp8 {

enum class ScalingMode : uint8_t {
  kTensor,        // one fp32 scale for the whole tensor (delayed and current scaling)
  kBlock1x128,    // one fp32 scale per 1x128 run along a row (activations, gradients)
  kBlock128x128,  // one fp32 scale per 128x128 block (weights)
  kMxfp8,         // one E8M0 scale per 1x32 run along a row (OCP MX)
};

inline const char* scaling_mode_name(ScalingMode mode) {
  switch (mode) {
    case ScalingMode::kTensor: return "tensor";
    case ScalingMode::kBlock1x128: return "1x128";
    case ScalingMode::kBlock128x128: return "128x128";
    case ScalingMode::kMxfp8: return "mxfp8-1x32";
  }
  return "?";
}

constexpr size_t kBlockLen = 128;  // blockwise recipe (DeepSeek-V3 style)
constexpr size_t kMxBlock = 32;    // OCP MX block

constexpr size_t ceil_div(size_t a, size_t b) { return (a + b - 1) / b; }
constexpr size_t round_up(size_t a, size_t b) { return ceil_div(a, b) * b; }

// Where the dequantization factors of a [rows, cols] matrix live. The scales form a grid of
// outer x inner entries stored with stride ld between outer entries:
//   tensor   outer = inner = ld = 1
//   1x128    outer = ceil(cols/128) column blocks, inner = rows, ld = round_up(rows, 4):
//            the scale of element (r, c) is at (c / 128) * ld + r ("M-major", cuBLASLt
//            VEC128_32F and TE's GEMM-ready layout; the padding keeps each run 16-byte aligned)
//   128x128  outer = ceil(rows/128), inner = ceil(cols/128), ld = round_up(inner, 4):
//            (r / 128) * ld + c / 128 (cuBLASLt BLK128x128_32F, TE's layout)
//   mxfp8    outer = rows, inner = ceil(cols/32), ld = inner: r * ld + c / 32, one E8M0 byte each
//            (compact row-major; not the swizzled layout Blackwell GEMMs read: Hopper runs MXFP8
//            emulated, so the scales are only read by our dequantize kernels)
struct ScaleLayout {
  size_t outer = 1;
  size_t inner = 1;
  size_t ld = 1;
  size_t element_bytes = 4;  // 4: fp32, 1: E8M0

  size_t elements() const { return outer * ld; }
  size_t bytes() const { return elements() * element_bytes; }
};

inline ScaleLayout scale_layout(ScalingMode mode, size_t rows, size_t cols) {
  switch (mode) {
    case ScalingMode::kTensor: return {1, 1, 1, 4};
    case ScalingMode::kBlock1x128: return {ceil_div(cols, kBlockLen), rows, round_up(rows, 4), 4};
    case ScalingMode::kBlock128x128: {
      const size_t inner = ceil_div(cols, kBlockLen);
      return {ceil_div(rows, kBlockLen), inner, round_up(inner, 4), 4};
    }
    case ScalingMode::kMxfp8: {
      const size_t inner = ceil_div(cols, kMxBlock);
      return {rows, inner, inner, 1};
    }
  }
  return {};
}

// Index into scale_inv of the factor that applies to element (row, col).
inline size_t scale_index(ScalingMode mode, const ScaleLayout& layout, size_t row, size_t col) {
  switch (mode) {
    case ScalingMode::kTensor: return 0;
    case ScalingMode::kBlock1x128: return (col / kBlockLen) * layout.ld + row;
    case ScalingMode::kBlock128x128: return (row / kBlockLen) * layout.ld + col / kBlockLen;
    case ScalingMode::kMxfp8: return row * layout.ld + col / kMxBlock;
  }
  return 0;
}

struct Fp8TensorView {
  void* data = nullptr;         // [rows, cols] codes, row-major; may be null when only data_t is needed
  void* data_t = nullptr;       // [cols, rows] codes of the transpose; null when not needed
  float* scale = nullptr;       // tensor scaling: the factor the quantizer multiplies by (1 float)
  void* scale_inv = nullptr;    // factors that dequantize data: fp32 (tensor, blocks) or E8M0 bytes (MXFP8)
  void* scale_inv_t = nullptr;  // the same for data_t (block modes; tensor scaling shares scale_inv)
  float* amax = nullptr;        // tensor scaling: max |x| (delayed: this step's history slot)
  Format format = Format::kE4M3;
  ScalingMode scaling_mode = ScalingMode::kTensor;
  size_t rows = 0;
  size_t cols = 0;

  size_t numel() const { return rows * cols; }
  ScaleLayout layout() const { return scale_layout(scaling_mode, rows, cols); }
  ScaleLayout layout_t() const { return scale_layout(scaling_mode, cols, rows); }
  // Dequantization factors of the transposed copy: its own for block modes, shared otherwise.
  void* scale_inv_for_t() const { return scaling_mode == ScalingMode::kTensor ? scale_inv : scale_inv_t; }
};

}  // namespace fp8tron::fp8
