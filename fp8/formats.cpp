#include "fp8/formats.h"

#include <algorithm>
#include <cctype>
#include <cmath>

#include "core/error.h"
#include "core/text.h"
#include "fp8/format_codec.h"

namespace fp8tron::fp8 {

namespace {

const FormatInfo kInfo[] = {
    {"E4M3", 448.0f, 0.015625f /*2^-6*/, 0.001953125f /*2^-9*/, 3, false, true, true},
    {"E5M2", 57344.0f, 6.103515625e-05f /*2^-14*/, 1.52587890625e-05f /*2^-16*/, 2, true, true, true},
    {"HiF8", 32768.0f, 3.0517578125e-05f /*2^-15*/, 2.384185791015625e-07f /*2^-22*/, 3, true, false, true},
    {"E8M0", 1.7014118346046923e38f /*2^127*/, 5.877471754111438e-39f /*2^-127*/, 5.877471754111438e-39f, 0,
     false, false, false},
};

}  // namespace

const FormatInfo& format_info(Format format) {
  const auto i = static_cast<size_t>(format);
  FP8TRON_CHECK(i < std::size(kInfo), "unknown FP8 format");
  return kInfo[i];
}

uint8_t encode(Format format, float x, Overflow overflow) {
  const bool saturate = overflow == Overflow::kSaturate;
  switch (format) {
    case Format::kE4M3: return codec::encode_e4m3(x, saturate);
    case Format::kE5M2: return codec::encode_e5m2(x, saturate);
    case Format::kHiF8: return codec::encode_hif8(x, saturate);
    case Format::kE8M0: return codec::encode_e8m0(x);
  }
  FP8TRON_CHECK(false, "unknown FP8 format");
  return 0;
}

float decode(Format format, uint8_t code) {
  switch (format) {
    case Format::kE4M3: return codec::decode_e4m3(code);
    case Format::kE5M2: return codec::decode_e5m2(code);
    case Format::kHiF8: return codec::decode_hif8(code);
    case Format::kE8M0: return codec::decode_e8m0(code);
  }
  FP8TRON_CHECK(false, "unknown FP8 format");
  return 0.0f;
}

bool is_nan_code(Format format, uint8_t code) { return std::isnan(decode(format, code)); }
bool is_inf_code(Format format, uint8_t code) { return std::isinf(decode(format, code)); }

void encode_array(Format format, const float* x, size_t n, float scale, uint8_t* out, Overflow overflow) {
  for (size_t i = 0; i < n; ++i) out[i] = encode(format, x[i] * scale, overflow);
}

void decode_array(Format format, const uint8_t* codes, size_t n, float scale_inv, float* out) {
  for (size_t i = 0; i < n; ++i) out[i] = decode(format, codes[i]) * scale_inv;
}

void fake_quantize(Format format, const float* x, size_t n, float scale, float* out, Overflow overflow) {
  const float scale_inv = 1.0f / scale;
  for (size_t i = 0; i < n; ++i) out[i] = decode(format, encode(format, x[i] * scale, overflow)) * scale_inv;
}

Format parse_format(const std::string& name) {
  std::string lower = name;
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  if (lower == "e4m3") return Format::kE4M3;
  if (lower == "e5m2") return Format::kE5M2;
  if (lower == "hif8") return Format::kHiF8;
  if (lower == "e8m0") return Format::kE8M0;
  const std::string hint = closest_match(lower, {"e4m3", "e5m2", "hif8", "e8m0"});
  throw UserError("unknown 8-bit format '" + name + "' (expected e4m3, e5m2, hif8 or e8m0)" +
                  (hint.empty() ? std::string() : "; did you mean '" + hint + "'?"));
}

}  // namespace fp8tron::fp8
