// Scale arithmetic shared by the CPU reference, the scaling state and the CUDA kernels (host and
// device inline), so that every path computes the same fp32 bits. Semantics are Transformer
// Engine's (recipe/recipe_common.cuh, recipe/delayed_scaling.cu, MXFP8 casts).
#pragma once
#include <cstdint>

#include "fp8/format_codec.h"

namespace fp8tron::fp8 {

constexpr float kFloatMax = 3.4028234663852886e38f;

// Correctly rounded fp32 division on both sides, whatever the nvcc flags (--use_fast_math would
// otherwise turn '/' into an approximation in device code).
FP8TRON_HD float div_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

FP8TRON_HD bool finite_positive(float x) {
  const uint32_t u = codec::float_bits(x);
  return (u >> 31) == 0 && u != 0 && (u & codec::kF32AbsMask) < codec::kF32Inf;
}

FP8TRON_HD bool is_nan_bits(float x) { return (codec::float_bits(x) & codec::kF32AbsMask) > codec::kF32Inf; }

// The amax rule, one definition for every path (kernels, CPU reference, scaling state):
//   amax = max |x| over the elements that are not NaN; +-inf gives +inf; no non-NaN element
//   leaves the running value unchanged (0 for a fresh reduction).
// This is CUDA's fmaxf (IEEE 754-2008 maxNum without the signaling-NaN clause: a NaN operand is
// treated as missing data) and hence Transformer Engine's, whose amax reductions are
// fmaxf(fabsf(x), amax). A NaN therefore never becomes an amax; an inf does, and the scale
// formulas below then keep (delayed) or reset (current, block) the scale.
// The host side must not use std::fmax: glibc's fmax follows maxNum to the letter and returns NaN
// when either operand is a *signaling* NaN (bf16 0x7F81..0x7FBF widen to fp32 sNaNs), after which
// the next fmax drops the NaN and with it every value seen before.
FP8TRON_HD float max_ignoring_nan(float a, float b) {
#if defined(__CUDA_ARCH__)
  return fmaxf(a, b);
#else
  if (is_nan_bits(b)) return a;
  if (is_nan_bits(a)) return b;
  return a < b ? b : a;
#endif
}

// m = max(m, |x|) under the amax rule (m is a running amax: >= 0, never NaN).
FP8TRON_HD float amax_fold(float m, float x) {
  return max_ignoring_nan(m, codec::bits_float(codec::float_bits(x) & codec::kF32AbsMask));
}

// Keep only the exponent: the largest power of two <= scale (for positive normal scales).
FP8TRON_HD float round_down_to_power_of_2(float scale) {
  return codec::bits_float(codec::float_bits(scale) & 0xFF800000u);
}

// Current scaling and block scaling: scale = fp8_max / max(amax, epsilon).
//   amax of 0, inf or NaN -> 1 (nothing sensible to do);
//   a tiny amax whose quotient overflows fp32 -> FLT_MAX;
//   power_2 -> rounded down to a power of two (so scale_inv is exact and the max never overflows).
FP8TRON_HD float scale_from_amax(float amax, float fp8_max, bool power_2, float epsilon) {
  if (amax < epsilon) amax = epsilon;
  if (!finite_positive(amax)) return 1.0f;
  float scale = div_rn(fp8_max, amax);
  if (codec::float_bits(scale) == codec::kF32Inf) scale = kFloatMax;
  if (power_2) scale = round_down_to_power_of_2(scale);
  return scale;
}

// Delayed scaling: scale = (fp8_max / amax) / 2^margin, computed as (fp8_max * 2^-margin) / amax as
// TE does (identical: the margin factor is a power of two). Keeps the previous scale when amax is
// 0, inf or NaN; FLT_MAX when the quotient overflows.
FP8TRON_HD float delayed_scale(float amax, float scaled_max, float previous_scale) {
  if (!finite_positive(amax)) return previous_scale;
  float scale = div_rn(scaled_max, amax);
  if (codec::float_bits(scale) == codec::kF32Inf) scale = kFloatMax;
  return scale;
}

// MXFP8: the block's E8M0 scale is the smallest power of two s with amax / s <= fp8_max, computed
// as TE does: round_up_pow2(amax * (1 / fp8_max)), with the reciprocal rounded to fp32 first.
FP8TRON_HD uint8_t mx_block_scale(float amax, float fp8_max_reciprocal) {
  return codec::encode_e8m0(amax * fp8_max_reciprocal);
}

}  // namespace fp8tron::fp8
