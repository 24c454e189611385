// The 8-bit number formats as typed values, and the host encode/decode API.
//
//   E4M3  OCP e4m3fn: bias 7, max 448, subnormals down to 2^-9, no infinity, NaN S.1111.111
//   E5M2  OCP e5m2:   bias 15, max 57344, subnormals down to 2^-16, +-inf, three NaNs per sign
//   HiF8  Ascend HiFloat8 (arXiv 2409.16626): tapered precision through a prefix-coded "dot"
//         field; 3 mantissa bits for |E| <= 3, 2 for |E| <= 7, 1 for |E| <= 15, denormal powers of
//         two 2^-22 .. 2^-16; max 32768; one zero, one NaN (0x80), +-inf (0x6F/0xEF)
//   E8M0  MX scale: 2^(c - 127), 0xFF NaN; no sign, no zero
//
// Rounding: E4M3/E5M2 round to nearest, ties to even (the PTX cvt.rn the kernels use); HiF8 rounds
// half away from zero (the paper's "TA" rounding); E8M0 rounds up to the next power of two
// (scales must not let a block overflow). Overflow and NaN handling: see Overflow and encode().
// The bit-level code lives in format_codec.h so that the CUDA kernels share it.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace fp8tron::fp8 {

enum class Format : uint8_t { kE4M3, kE5M2, kHiF8, kE8M0 };

// What happens to values beyond the largest finite value (and to +-inf).
//   kSaturate: clamp to +-max (Transformer Engine's cast, PTX .satfinite). +-inf -> +-max.
//   kNonSaturating: E4M3 -> NaN (it has no infinity), E5M2/HiF8 -> +-inf; +-inf stays +-inf
//     (E4M3: NaN). Matches torch's .to(float8_e4m3fn / float8_e5m2) casts.
// E8M0 always saturates at 2^127.
enum class Overflow : uint8_t { kSaturate, kNonSaturating };

struct FormatInfo {
  const char* name;        // "E4M3", ...
  float max_finite;        // largest finite value
  float min_normal;        // smallest positive normal value
  float min_subnormal;     // smallest positive value
  int mantissa_bits;       // stored mantissa bits (HiF8: the widest, 3)
  bool has_infinity;
  bool has_negative_zero;
  bool is_signed;
};

const FormatInfo& format_info(Format format);
inline const char* format_name(Format format) { return format_info(format).name; }
inline float max_finite(Format format) { return format_info(format).max_finite; }

// Encode one value. NaN input: E4M3/E5M2 -> 0x7F (canonical, the sign is dropped), HiF8 -> 0x80,
// E8M0 -> 0xFF. Zeros keep their sign in E4M3/E5M2; HiF8 has a single zero (0x00). E8M0 takes
// positive values only (negative -> 0xFF) and maps x <= 2^-127 to 0x00.
uint8_t encode(Format format, float x, Overflow overflow = Overflow::kSaturate);
float decode(Format format, uint8_t code);

bool is_nan_code(Format format, uint8_t code);
bool is_inf_code(Format format, uint8_t code);

// Bulk host helpers for the CPU emulation path (e.g. over a torch tensor's float buffer):
//   encode_array: out[i] = encode(x[i] * scale)
//   decode_array: out[i] = decode(codes[i]) * scale_inv
//   fake_quantize: out[i] = decode(encode(x[i] * scale)) * scale_inv, where scale_inv = 1 / scale
// The products are single fp32 multiplications, as in the CUDA kernels.
void encode_array(Format format, const float* x, size_t n, float scale, uint8_t* out,
                  Overflow overflow = Overflow::kSaturate);
void decode_array(Format format, const uint8_t* codes, size_t n, float scale_inv, float* out);
void fake_quantize(Format format, const float* x, size_t n, float scale, float* out,
                   Overflow overflow = Overflow::kSaturate);

// "e4m3" / "E4M3" / "e5m2" / "hif8" / "e8m0" -> Format; UserError with a suggestion otherwise.
Format parse_format(const std::string& name);

}  // namespace fp8tron::fp8
