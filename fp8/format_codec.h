// Bit-exact encoders and decoders for the 8-bit formats, as inline functions that compile both
// on the host and in CUDA device code. formats.cpp wraps them in the typed host API; the
// quantize kernels call them directly (HiF8, E8M0, bf16) or check the hardware conversion
// instructions against them (E4M3, E5M2), so the CPU reference and the GPU agree bit for bit.
//
// Provides: bf16 <-> float, E4M3 / E5M2 (OCP FP8, round-to-nearest-even), HiF8 (Ascend
// HiFloat8, round-half-away-from-zero as in the paper), E8M0 (MX scale: power of two, rounded up).
// No CUDA headers needed: in .cu files include this after cuda_runtime.h or on its own.
#pragma once
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define FP8TRON_HD __host__ __device__ __forceinline__
#else
#define FP8TRON_HD inline
#endif

namespace fp8tron::fp8::codec {

FP8TRON_HD uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
#endif
}

FP8TRON_HD float bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
#endif
}

constexpr uint32_t kF32AbsMask = 0x7FFFFFFFu;
constexpr uint32_t kF32Inf = 0x7F800000u;

// ---- bf16 (stored as uint16_t) --------------------------------------------------------------
FP8TRON_HD float bf16_to_float(uint16_t h) { return bits_float(static_cast<uint32_t>(h) << 16); }

// Round-to-nearest-even; NaN becomes the canonical 0x7FFF (as __float2bfloat16_rn does).
FP8TRON_HD uint16_t float_to_bf16(float f) {
  const uint32_t u = float_bits(f);
  if ((u & kF32AbsMask) > kF32Inf) return 0x7FFF;
  const uint32_t rounding = 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>((u + rounding) >> 16);
}

// ---- OCP FP8: E4M3 (e4m3fn) and E5M2 ------------------------------------------------------------
// Shared rounding core for the two IEEE-like FP8 formats. kMan mantissa bits, kBias exponent bias,
// kMaxCode the largest finite magnitude code. Returns the magnitude code (no sign) before the
// overflow check; values too large return kMaxCode + 1 or more.
template <int kMan, int kBias>
FP8TRON_HD uint32_t fp8_round_magnitude(uint32_t abs_bits) {
  const int32_t f32_exp = static_cast<int32_t>(abs_bits >> 23);
  if (f32_exp == 0) return 0;  // fp32 zero / subnormal: far below any FP8 subnormal
  const uint32_t significand = (abs_bits & 0x7FFFFFu) | 0x800000u;  // 24 bits with implicit 1
  const int32_t target_exp = f32_exp - 127 + kBias;               // biased FP8 exponent
  int32_t shift = 23 - kMan;                                        // drop fp32 mantissa bits
  if (target_exp < 1) shift += 1 - target_exp;                      // FP8 subnormal range
  if (shift > 25) return 0;  // below half the smallest subnormal
  uint32_t q = significand >> shift;
  const uint32_t rem = significand & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1);
  if (rem > half || (rem == half && (q & 1u))) ++q;
  if (target_exp < 1) return q;  // subnormal code (q == 1 << kMan is the smallest normal: still right)
  // Normal: q in [2^kMan, 2^(kMan+1)]; a carry moves to the next binade.
  return (static_cast<uint32_t>(target_exp) << kMan) + (q - (1u << kMan));
}

// The OCP formats' encoder: round the magnitude (kMan mantissa bits, bias kBias), then clamp to
// kMaxCode, or give kOverflowCode (E4M3: NaN, E5M2: inf) without saturation; +-inf likewise; a NaN
// input gives 0x7F (canonical, sign dropped). Zero keeps its sign.
template <int kMan, int kBias, uint32_t kMaxCode, uint32_t kOverflowCode>
FP8TRON_HD uint8_t encode_ocp_fp8(float x, bool saturate) {
  const uint32_t u = float_bits(x);
  const uint32_t sign = (u >> 24) & 0x80u;
  const uint32_t a = u & kF32AbsMask;
  if (a > kF32Inf) return 0x7F;
  uint32_t mag = a == kF32Inf ? kOverflowCode : fp8_round_magnitude<kMan, kBias>(a);
  if (mag > kMaxCode) mag = saturate ? kMaxCode : kOverflowCode;
  return static_cast<uint8_t>(sign | mag);
}

// E4M3 (OCP e4m3fn): bias 7, max 448 (0x7E), no infinity, NaN = S.1111.111.
// saturate = true: |x| > 448 and +-inf give +-448 (TE's saturating cast, PTX cvt .satfinite).
// saturate = false: values that round above 448 and +-inf give NaN (0x7F).
FP8TRON_HD uint8_t encode_e4m3(float x, bool saturate) { return encode_ocp_fp8<3, 7, 0x7Eu, 0x7Fu>(x, saturate); }

FP8TRON_HD float decode_e4m3(uint8_t c) {
  const uint32_t sign = static_cast<uint32_t>(c & 0x80u) << 24;
  const uint32_t e = (c >> 3) & 0xFu, m = c & 0x7u;
  if (e == 0xFu && m == 0x7u) return bits_float(0x7FC00000u | sign);
  if (e == 0) return bits_float(float_bits(static_cast<float>(m) * 0.001953125f) | sign);  // m * 2^-9
  return bits_float(sign | ((e - 7u + 127u) << 23) | (m << 20));
}

// E5M2: bias 15, max 57344 (0x7B), +-inf = S.11111.00, NaN = S.11111.{01,10,11}.
// saturate = true: |x| > 57344 and +-inf give +-57344. saturate = false: overflow gives +-inf and
// +-inf stays +-inf.
FP8TRON_HD uint8_t encode_e5m2(float x, bool saturate) { return encode_ocp_fp8<2, 15, 0x7Bu, 0x7Cu>(x, saturate); }

FP8TRON_HD float decode_e5m2(uint8_t c) {
  const uint32_t sign = static_cast<uint32_t>(c & 0x80u) << 24;
  const uint32_t e = (c >> 2) & 0x1Fu, m = c & 0x3u;
  if (e == 0x1Fu) return bits_float(sign | (m == 0 ? kF32Inf : 0x7FC00000u));
  if (e == 0) return bits_float(float_bits(static_cast<float>(m) * 1.52587890625e-05f) | sign);  // m * 2^-16
  return bits_float(sign | ((e - 15u + 127u) << 23) | (m << 21));
}

// ---- HiF8 (Ascend HiFloat8, arXiv 2409.16626) ---------------------------------------------------
// Layout, most significant bit first: sign (1) | dot (prefix code) | exponent | mantissa.
//   dot 11   -> 4 exponent bits, 1 mantissa bit,  |E| in 8..15
//   dot 10   -> 3 exponent bits, 2 mantissa bits, |E| in 4..7
//   dot 01   -> 2 exponent bits, 3 mantissa bits, |E| in 2..3
//   dot 001  -> 1 exponent bit,  3 mantissa bits, |E| = 1
//   dot 0001 -> 0 exponent bits, 3 mantissa bits, E = 0
//   dot 0000 -> denormal: 3 bits M, value 2^(M - 23) for M in 1..7 (2^-22 .. 2^-16)
// The exponent field is sign-magnitude: its first bit is the exponent sign (1 = negative), the rest
// are the magnitude without its leading 1 (implicit, as the dot already fixes the bit width).
// Normal value = (-1)^S * 2^E * (1 + mantissa / 2^w). Specials: 0x00 zero (the only zero),
// 0x80 NaN, 0x6F +inf and 0xEF -inf (the E = 15, mantissa 1 codes). Max finite 2^15 = 32768.
constexpr float kHiF8Max = 32768.0f;

FP8TRON_HD float decode_hif8(uint8_t c) {
  const uint32_t sign = static_cast<uint32_t>(c & 0x80u) << 24;
  const uint32_t a = c & 0x7Fu;
  if (a == 0) return sign ? bits_float(0x7FC00000u) : 0.0f;
  if (a == 0x6Fu) return bits_float(sign | kF32Inf);
  int32_t exp_mag;
  uint32_t exp_neg, mant, width;
  switch (a >> 5) {
    case 3:  exp_neg = (a >> 4) & 1u; exp_mag = 8 + static_cast<int32_t>((a >> 1) & 7u); mant = a & 1u; width = 1; break;
    case 2:  exp_neg = (a >> 4) & 1u; exp_mag = 4 + static_cast<int32_t>((a >> 2) & 3u); mant = a & 3u; width = 2; break;
    case 1:  exp_neg = (a >> 4) & 1u; exp_mag = 2 + static_cast<int32_t>((a >> 3) & 1u); mant = a & 7u; width = 3; break;
    default:
      if (a & 0x10u) {  // dot 001
        exp_neg = (a >> 3) & 1u; exp_mag = 1; mant = a & 7u; width = 3;
      } else if (a & 0x08u) {  // dot 0001
        exp_neg = 0; exp_mag = 0; mant = a & 7u; width = 3;
      } else {  // dot 0000: denormal 2^(M-23)
        return bits_float(sign | (static_cast<uint32_t>(static_cast<int32_t>(a) - 23 + 127) << 23));
      }
  }
  const int32_t e = exp_neg ? -exp_mag : exp_mag;
  return bits_float(sign | (static_cast<uint32_t>(e + 127) << 23) | (mant << (23 - width)));
}

// Code for a finite value 2^e * (1 + mant / 2^w) already rounded to the width of its exponent
// range, or for a denormal power of two (e in -22..-16, mant = 0).
FP8TRON_HD uint32_t hif8_pack(int32_t e, uint32_t mant) {
  if (e <= -16) return static_cast<uint32_t>(e + 23);  // dot 0000
  const uint32_t neg = e < 0 ? 1u : 0u;
  const uint32_t mag = static_cast<uint32_t>(e < 0 ? -e : e);
  if (mag == 0) return 0x08u | mant;                                   // dot 0001
  if (mag == 1) return 0x10u | (neg << 3) | mant;                      // dot 001
  if (mag <= 3) return 0x20u | (neg << 4) | ((mag - 2) << 3) | mant;  // dot 01
  if (mag <= 7) return 0x40u | (neg << 4) | ((mag - 4) << 2) | mant;  // dot 10
  return 0x60u | (neg << 4) | ((mag - 8) << 1) | mant;                 // dot 11
}

// Mantissa width for a binary exponent: 3 for |e| <= 3, 2 for 4..7, 1 for 8..15, 0 for the
// denormal powers of two (-22..-16).
FP8TRON_HD int32_t hif8_mantissa_width(int32_t e) {
  const int32_t mag = e < 0 ? -e : e;
  return mag <= 3 ? 3 : mag <= 7 ? 2 : mag <= 15 ? 1 : 0;
}

// Round half away from zero ("TA", the paper's rounding for HiF8) at the precision of the value's
// own binade. |x| >= 2^15 * 1.25 overflows: +-inf, or +-32768 with saturate (+-inf input likewise).
// |x| < 2^-23 gives 0 (2^-23 itself is the tie between 0 and 2^-22 and rounds away, to 2^-22).
// NaN gives 0x80. Both zeros give 0x00 (HiF8 has one zero).
FP8TRON_HD uint8_t encode_hif8(float x, bool saturate) {
  const uint32_t u = float_bits(x);
  const uint32_t sign = (u >> 24) & 0x80u;
  const uint32_t a = u & kF32AbsMask;
  if (a > kF32Inf) return 0x80;
  const uint32_t overflow = sign | (saturate ? 0x6Eu : 0x6Fu);
  if (a == kF32Inf) return static_cast<uint8_t>(overflow);
  int32_t e = static_cast<int32_t>(a >> 23) - 127;
  if (e < -23) return 0;  // includes zero and fp32 subnormals
  if (e == -23) return static_cast<uint8_t>(sign | 0x01u);  // [2^-23, 2^-22) -> 2^-22
  const int32_t w = hif8_mantissa_width(e);
  uint32_t frac = a & 0x7FFFFFu;
  frac += 1u << (22 - w);  // add half an ulp of the target precision: ties go away from zero
  if (frac & 0x800000u) {  // carried into the next binade: mantissa becomes 0
    ++e;
    frac = 0;
  }
  const uint32_t mant = w == 0 ? 0u : (frac >> (23 - w)) & ((1u << w) - 1u);
  // 2^15 * 1.5 is the infinity code: everything from 2^15 * 1.25 up overflows.
  if (e > 15 || (e == 15 && mant != 0)) return static_cast<uint8_t>(overflow);
  return static_cast<uint8_t>(sign | hif8_pack(e, mant));
}

// ---- E8M0 (MX scale) ------------------------------------------------------------------------------
// Unsigned power of two 2^(c - 127) for c in 0..254; 0xFF is NaN. 0x00 is 2^-127 (an fp32
// subnormal), not zero.
FP8TRON_HD float decode_e8m0(uint8_t c) {
  if (c == 0xFF) return bits_float(0x7FC00000u);
  if (c == 0) return bits_float(0x00400000u);
  return bits_float(static_cast<uint32_t>(c) << 23);
}

// 1 / decode_e8m0(c), exact (the reciprocal of a power of two). c = 254 gives 2^-127.
FP8TRON_HD float e8m0_reciprocal(uint8_t c) {
  if (c == 0xFF) return bits_float(0x7FC00000u);
  const int32_t biased = 254 - static_cast<int32_t>(c);
  if (biased == 0) return bits_float(0x00400000u);
  return bits_float(static_cast<uint32_t>(biased) << 23);
}

// Smallest power of two >= x (round toward +inf, as TE's MXFP8 scale computation does so that a
// block's amax never exceeds the element format's max after scaling). Saturates at 2^127 (0xFE)
// for large finite values and +inf; x <= 2^-127 (including 0) gives 0x00; NaN and negative
// values give 0xFF.
FP8TRON_HD uint8_t encode_e8m0(float x) {
  const uint32_t u = float_bits(x);
  if ((u & kF32AbsMask) > kF32Inf) return 0xFF;
  if ((u >> 31) && (u & kF32AbsMask) != 0) return 0xFF;
  const uint32_t a = u & kF32AbsMask;
  if (a <= 0x00400000u) return 0x00;
  if (a < 0x00800000u) return 0x01;  // (2^-127, 2^-126)
  uint32_t e = a >> 23;
  if (e >= 0xFEu) return 0xFE;
  if (a & 0x7FFFFFu) ++e;
  return static_cast<uint8_t>(e);
}

}  // namespace fp8tron::fp8::codec
