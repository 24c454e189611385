// FP8 formats: every code of E4M3, E5M2 and HiF8 decodes and re-encodes to itself, rounding at
// every boundary between neighbouring values (ties to even for OCP FP8, ties away for HiF8),
// saturation, subnormals, special values, E8M0 scales and the bf16 helpers.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <vector>

#include "core/error.h"
#include "fp8/format_codec.h"
#include "fp8/formats.h"

namespace fp8tron::fp8 {
namespace {

const float kNaN = std::numeric_limits<float>::quiet_NaN();
const float kInf = std::numeric_limits<float>::infinity();

uint8_t canonical_nan(Format f) { return f == Format::kHiF8 ? 0x80 : 0x7F; }

// All finite, non-negative values of a format with their codes, ascending.
std::vector<std::pair<float, uint8_t>> positive_values(Format f) {
  std::vector<std::pair<float, uint8_t>> v;
  for (int c = 0; c < 128; ++c) {
    const float x = decode(f, static_cast<uint8_t>(c));
    if (std::isfinite(x)) v.emplace_back(x, static_cast<uint8_t>(c));
  }
  std::sort(v.begin(), v.end());
  return v;
}

class EveryCode : public ::testing::TestWithParam<Format> {};

TEST_P(EveryCode, DecodeThenEncodeIsIdentity) {
  const Format f = GetParam();
  for (int c = 0; c < 256; ++c) {
    const auto code = static_cast<uint8_t>(c);
    const float x = decode(f, code);
    for (Overflow o : {Overflow::kSaturate, Overflow::kNonSaturating}) {
      const uint8_t back = encode(f, x, o);
      if (std::isnan(x)) {
        EXPECT_EQ(back, canonical_nan(f)) << format_name(f) << " NaN code " << c;
      } else if (std::isinf(x) && o == Overflow::kSaturate) {
        EXPECT_EQ(decode(f, back), std::copysign(max_finite(f), x)) << format_name(f) << " code " << c;
      } else {
        EXPECT_EQ(back, code) << format_name(f) << " code " << c << " value " << x;
      }
    }
  }
}

TEST_P(EveryCode, ValuesAreDistinctAndSymmetric) {
  const Format f = GetParam();
  const auto pos = positive_values(f);
  for (size_t i = 1; i < pos.size(); ++i) EXPECT_LT(pos[i - 1].first, pos[i].first) << format_name(f);
  EXPECT_EQ(pos.back().first, max_finite(f));
  EXPECT_EQ(pos[1].first, format_info(f).min_subnormal);
  for (int c = 1; c < 128; ++c) {
    const float x = decode(f, static_cast<uint8_t>(c)), y = decode(f, static_cast<uint8_t>(c | 0x80));
    if (std::isnan(x)) continue;
    EXPECT_EQ(-x, y) << format_name(f) << " code " << c;
  }
}

// Between every pair of neighbouring values: the midpoint follows the tie rule, the floats just
// either side of it round to the nearer neighbour.
TEST_P(EveryCode, RoundsToNearestAtEveryBoundary) {
  const Format f = GetParam();
  const auto pos = positive_values(f);
  for (size_t i = 1; i < pos.size(); ++i) {
    const auto [lo, lo_code] = pos[i - 1];
    const auto [hi, hi_code] = pos[i];
    const float mid = (lo + hi) / 2;  // exact: the values have at most 4 significant bits
    ASSERT_EQ(mid - lo, hi - mid);
    uint8_t tie;
    if (f == Format::kHiF8) {
      tie = hi_code;  // ties away from zero
    } else {
      tie = (lo_code & 1) ? hi_code : lo_code;  // ties to even
    }
    EXPECT_EQ(encode(f, mid), tie) << format_name(f) << " tie between " << lo << " and " << hi;
    EXPECT_EQ(encode(f, std::nextafter(mid, 0.0f)), lo_code) << format_name(f) << " below " << mid;
    EXPECT_EQ(encode(f, std::nextafter(mid, kInf)), hi_code) << format_name(f) << " above " << mid;
    EXPECT_EQ(encode(f, -mid), static_cast<uint8_t>(tie | (f == Format::kHiF8 && tie == 0 ? 0 : 0x80)));
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, EveryCode, ::testing::Values(Format::kE4M3, Format::kE5M2, Format::kHiF8),
                         [](const auto& info) { return std::string(format_name(info.param)); });

TEST(E4M3, KnownValuesAndSpecials) {
  EXPECT_EQ(decode(Format::kE4M3, 0x7E), 448.0f);
  EXPECT_EQ(decode(Format::kE4M3, 0x38), 1.0f);
  EXPECT_EQ(decode(Format::kE4M3, 0x08), 0.015625f);      // min normal 2^-6
  EXPECT_EQ(decode(Format::kE4M3, 0x01), 0.001953125f);   // min subnormal 2^-9
  EXPECT_EQ(decode(Format::kE4M3, 0x07), 7 * 0.001953125f);
  EXPECT_TRUE(std::isnan(decode(Format::kE4M3, 0x7F)));
  EXPECT_TRUE(std::isnan(decode(Format::kE4M3, 0xFF)));
  EXPECT_EQ(std::signbit(decode(Format::kE4M3, 0x80)), true);
  int nan_codes = 0;
  for (int c = 0; c < 256; ++c) nan_codes += is_nan_code(Format::kE4M3, static_cast<uint8_t>(c));
  EXPECT_EQ(nan_codes, 2);
  for (int c = 0; c < 256; ++c) EXPECT_FALSE(is_inf_code(Format::kE4M3, static_cast<uint8_t>(c)));
}

TEST(E4M3, SaturationAndOverflow) {
  const Format f = Format::kE4M3;
  EXPECT_EQ(encode(f, 448.0f), 0x7E);
  EXPECT_EQ(encode(f, std::nextafter(448.0f, kInf)), 0x7E);
  EXPECT_EQ(encode(f, 1e30f), 0x7E);
  EXPECT_EQ(encode(f, -1e30f), 0xFE);
  EXPECT_EQ(encode(f, kInf), 0x7E);
  EXPECT_EQ(encode(f, -kInf), 0xFE);
  // Without saturation: 464 is the tie between 448 and the (NaN) slot above; even wins.
  EXPECT_EQ(encode(f, 464.0f, Overflow::kNonSaturating), 0x7E);
  EXPECT_EQ(encode(f, std::nextafter(464.0f, kInf), Overflow::kNonSaturating), 0x7F);
  EXPECT_EQ(encode(f, kInf, Overflow::kNonSaturating), 0x7F);
  EXPECT_EQ(encode(f, kNaN), 0x7F);
  EXPECT_EQ(encode(f, -kNaN), 0x7F);
}

TEST(E4M3, Subnormals) {
  const Format f = Format::kE4M3;
  const float d = 0.001953125f;  // 2^-9
  EXPECT_EQ(encode(f, d), 0x01);
  EXPECT_EQ(encode(f, d / 2), 0x00);                             // tie with 0: even is 0
  EXPECT_EQ(encode(f, std::nextafter(d / 2, 1.0f)), 0x01);
  EXPECT_EQ(encode(f, 1.5f * d), 0x02);                          // tie 1 vs 2: even
  EXPECT_EQ(encode(f, 2.5f * d), 0x02);                          // tie 2 vs 3: even
  EXPECT_EQ(encode(f, 7.5f * d), 0x08);                          // into the first normal binade
  EXPECT_EQ(encode(f, 1e-30f), 0x00);
  EXPECT_EQ(encode(f, -1e-30f), 0x80);                           // sign kept on underflow
  EXPECT_EQ(encode(f, std::numeric_limits<float>::denorm_min()), 0x00);
  EXPECT_EQ(encode(f, -0.0f), 0x80);
}

TEST(E5M2, KnownValuesSaturationSubnormals) {
  const Format f = Format::kE5M2;
  EXPECT_EQ(decode(f, 0x7B), 57344.0f);
  EXPECT_EQ(decode(f, 0x3C), 1.0f);
  EXPECT_EQ(decode(f, 0x01), 1.52587890625e-05f);  // 2^-16
  EXPECT_EQ(decode(f, 0x7C), kInf);
  EXPECT_EQ(decode(f, 0xFC), -kInf);
  int nan_codes = 0;
  for (int c = 0; c < 256; ++c) nan_codes += is_nan_code(f, static_cast<uint8_t>(c));
  EXPECT_EQ(nan_codes, 6);
  EXPECT_EQ(encode(f, 1e30f), 0x7B);
  EXPECT_EQ(encode(f, kInf), 0x7B);
  EXPECT_EQ(encode(f, -kInf), 0xFB);
  EXPECT_EQ(encode(f, kInf, Overflow::kNonSaturating), 0x7C);
  EXPECT_EQ(encode(f, -kInf, Overflow::kNonSaturating), 0xFC);
  // 61440 is the tie between 57344 (odd mantissa) and 65536 (= inf): even wins, i.e. inf.
  EXPECT_EQ(encode(f, 61440.0f, Overflow::kNonSaturating), 0x7C);
  EXPECT_EQ(encode(f, std::nextafter(61440.0f, 0.0f), Overflow::kNonSaturating), 0x7B);
  EXPECT_EQ(encode(f, 61440.0f), 0x7B);
  EXPECT_EQ(encode(f, 1.52587890625e-05f / 2), 0x00);
  EXPECT_EQ(encode(f, 3 * 1.52587890625e-05f / 2), 0x02);
  EXPECT_EQ(encode(f, kNaN), 0x7F);
}

TEST(HiF8, FieldLayoutAndSpecialValues) {
  const Format f = Format::kHiF8;
  EXPECT_EQ(decode(f, 0x00), 0.0f);
  EXPECT_TRUE(std::isnan(decode(f, 0x80)));
  EXPECT_EQ(decode(f, 0x6F), kInf);
  EXPECT_EQ(decode(f, 0xEF), -kInf);
  EXPECT_EQ(decode(f, 0x6E), 32768.0f);                     // 0 11 0111 0: E = +15
  EXPECT_EQ(decode(f, 0x7E), 3.0517578125e-05f);            // 0 11 1111 0: E = -15, min normal
  EXPECT_EQ(decode(f, 0x7F), 1.5f * 3.0517578125e-05f);     // E = -15, mantissa 1
  EXPECT_EQ(decode(f, 0x01), 2.384185791015625e-07f);       // denormal 2^-22
  EXPECT_EQ(decode(f, 0x07), 1.52587890625e-05f);           // denormal 2^-16
  EXPECT_EQ(decode(f, 0x08), 1.0f);                         // dot 0001: E = 0
  EXPECT_EQ(decode(f, 0x0F), 1.875f);
  EXPECT_EQ(decode(f, 0x10), 2.0f);                         // dot 001, exponent sign 0: E = +1
  EXPECT_EQ(decode(f, 0x18), 0.5f);                         // dot 001, exponent sign 1: E = -1
  EXPECT_EQ(decode(f, 0x20), 4.0f);                         // dot 01, +2
  EXPECT_EQ(decode(f, 0x28), 8.0f);                         // dot 01, +3
  EXPECT_EQ(decode(f, 0x38), 0.125f);                       // dot 01, -3
  EXPECT_EQ(decode(f, 0x40), 16.0f);                        // dot 10, +4
  EXPECT_EQ(decode(f, 0x4C), 128.0f);                       // dot 10, +7
  EXPECT_EQ(decode(f, 0x43), 28.0f);                        // 16 * 1.75
  EXPECT_EQ(decode(f, 0x60), 256.0f);                       // dot 11, +8
  EXPECT_EQ(decode(f, 0x61), 384.0f);                       // 256 * 1.5
  int nan_codes = 0, inf_codes = 0, zero_codes = 0;
  for (int c = 0; c < 256; ++c) {
    const float x = decode(f, static_cast<uint8_t>(c));
    nan_codes += std::isnan(x);
    inf_codes += std::isinf(x);
    zero_codes += x == 0.0f;
  }
  EXPECT_EQ(nan_codes, 1);
  EXPECT_EQ(inf_codes, 2);
  EXPECT_EQ(zero_codes, 1);  // only +0
}

// The paper's tapered precision: 8 values per binade for |E| <= 3 (3 mantissa bits), 4 for
// |E| in 4..7, 2 for |E| in 8..15, one per binade for the denormals 2^-22 .. 2^-16: 38 binades.
TEST(HiF8, TaperedPrecisionPerBinade) {
  std::map<int, int> per_binade;
  for (const auto& [x, code] : positive_values(Format::kHiF8)) {
    if (x > 0) ++per_binade[std::ilogb(x)];
  }
  EXPECT_EQ(per_binade.size(), 38u);
  for (const auto& [e, count] : per_binade) {
    const int mag = std::abs(e);
    // 2^15 * 1.5 is the infinity code, so the top binade holds only 2^15 itself.
    const int expected = (e < -15 || e == 15) ? 1 : mag <= 3 ? 8 : mag <= 7 ? 4 : 2;
    EXPECT_EQ(count, expected) << "binade 2^" << e;
  }
  EXPECT_EQ(per_binade.begin()->first, -22);
  EXPECT_EQ(per_binade.rbegin()->first, 15);
}

TEST(HiF8, RoundingOverflowUnderflow) {
  const Format f = Format::kHiF8;
  // Overflow: the infinity code sits where 1.5 * 2^15 would be, so 1.25 * 2^15 (the tie) and
  // above overflow; with saturation they clamp to 32768.
  EXPECT_EQ(encode(f, 40960.0f, Overflow::kNonSaturating), 0x6F);
  EXPECT_EQ(encode(f, std::nextafter(40960.0f, 0.0f), Overflow::kNonSaturating), 0x6E);
  EXPECT_EQ(encode(f, 40960.0f), 0x6E);
  EXPECT_EQ(encode(f, 1e30f), 0x6E);
  EXPECT_EQ(encode(f, -1e30f), 0xEE);
  EXPECT_EQ(encode(f, kInf), 0x6E);
  EXPECT_EQ(encode(f, kInf, Overflow::kNonSaturating), 0x6F);
  EXPECT_EQ(encode(f, -kInf, Overflow::kNonSaturating), 0xEF);
  // Underflow: 2^-23 is the tie between 0 and 2^-22 and rounds away.
  const float min = 2.384185791015625e-07f;
  EXPECT_EQ(encode(f, min / 2), 0x01);
  EXPECT_EQ(encode(f, std::nextafter(min / 2, 0.0f)), 0x00);
  EXPECT_EQ(encode(f, -min / 2), 0x81);
  EXPECT_EQ(encode(f, -std::nextafter(min / 2, 0.0f)), 0x00);  // one zero: no -0
  EXPECT_EQ(encode(f, -0.0f), 0x00);
  EXPECT_EQ(encode(f, kNaN), 0x80);
  // Ties away in the 3-bit binade: 1 + 1/16 -> 1.125; in the 1-bit binade 2^8 * 1.25 -> 384.
  EXPECT_EQ(decode(f, encode(f, 1.0625f)), 1.125f);
  EXPECT_EQ(decode(f, encode(f, 320.0f)), 384.0f);
  EXPECT_EQ(decode(f, encode(f, -320.0f)), -384.0f);
  // Denormal binades: 1.5 * 2^-17 ties to 2^-16.
  EXPECT_EQ(decode(f, encode(f, 1.5f * 7.62939453125e-06f)), 1.52587890625e-05f);
  // Rounding up out of the denormal range into the first normal binade: 1.5 * 2^-16 -> 2^-15.
  EXPECT_EQ(encode(f, 1.5f * 1.52587890625e-05f), 0x7E);
}

TEST(E8M0, ScaleValues) {
  const Format f = Format::kE8M0;
  EXPECT_EQ(decode(f, 127), 1.0f);
  EXPECT_EQ(decode(f, 128), 2.0f);
  EXPECT_EQ(decode(f, 126), 0.5f);
  EXPECT_EQ(decode(f, 254), std::ldexp(1.0f, 127));
  EXPECT_EQ(decode(f, 0), std::ldexp(1.0f, -127));
  EXPECT_TRUE(std::isnan(decode(f, 255)));
  for (int c = 0; c < 255; ++c) {
    const auto code = static_cast<uint8_t>(c);
    EXPECT_EQ(encode(f, decode(f, code)), code) << c;
    EXPECT_EQ(codec::e8m0_reciprocal(code) * decode(f, code), 1.0f) << c;
  }
  EXPECT_EQ(encode(f, 1.5f), 128);  // rounds up
  EXPECT_EQ(encode(f, 0.75f), 127);
  EXPECT_EQ(encode(f, std::nextafter(1.0f, 2.0f)), 128);
  EXPECT_EQ(encode(f, 0.0f), 0);
  EXPECT_EQ(encode(f, 8e-39f), 1);  // fp32 subnormal in (2^-127, 2^-126)
  EXPECT_EQ(encode(f, 1e-39f), 0);  // below 2^-127
  EXPECT_EQ(encode(f, 3e38f), 254);  // saturates
  EXPECT_EQ(encode(f, kInf), 254);
  EXPECT_EQ(encode(f, kNaN), 255);
  EXPECT_EQ(encode(f, -1.0f), 255);
}

TEST(Bf16, RoundToNearestEven) {
  using codec::bf16_to_float;
  using codec::float_to_bf16;
  EXPECT_EQ(float_to_bf16(1.0f), 0x3F80);
  EXPECT_EQ(float_to_bf16(1.0f + 1.0f / 256), 0x3F80);      // tie: even
  EXPECT_EQ(float_to_bf16(1.0f + 3.0f / 256), 0x3F82);      // tie: even (up)
  EXPECT_EQ(float_to_bf16(std::nextafter(1.0f + 1.0f / 256, 2.0f)), 0x3F81);
  EXPECT_EQ(float_to_bf16(kNaN), 0x7FFF);
  EXPECT_EQ(float_to_bf16(kInf), 0x7F80);
  EXPECT_EQ(float_to_bf16(3.4e38f), 0x7F80);                // rounds to inf
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float x = bf16_to_float(static_cast<uint16_t>(h));
    if (!std::isnan(x)) {
      EXPECT_EQ(float_to_bf16(x), h);
    }
  }
}

TEST(Formats, InfoAndParsing) {
  EXPECT_EQ(max_finite(Format::kE4M3), 448.0f);
  EXPECT_EQ(max_finite(Format::kE5M2), 57344.0f);
  EXPECT_EQ(max_finite(Format::kHiF8), 32768.0f);
  EXPECT_STREQ(format_name(Format::kHiF8), "HiF8");
  EXPECT_EQ(parse_format("E4M3"), Format::kE4M3);
  EXPECT_EQ(parse_format("hif8"), Format::kHiF8);
  try {
    parse_format("e4m2");
    FAIL() << "expected UserError";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("did you mean"), std::string::npos) << e.what();
  }
}

TEST(Formats, BulkHelpers) {
  const std::vector<float> x = {0.0f, 1.0f, -3.3f, 1000.0f, 1e-6f};
  std::vector<uint8_t> q(x.size());
  encode_array(Format::kE4M3, x.data(), x.size(), 2.0f, q.data());
  for (size_t i = 0; i < x.size(); ++i) EXPECT_EQ(q[i], encode(Format::kE4M3, x[i] * 2.0f));
  std::vector<float> y(x.size()), z(x.size());
  decode_array(Format::kE4M3, q.data(), q.size(), 0.5f, y.data());
  fake_quantize(Format::kE4M3, x.data(), x.size(), 2.0f, z.data());
  EXPECT_EQ(y, z);
  EXPECT_EQ(z[3], 224.0f);  // 2000 saturates to 448, times 1/2
  fake_quantize(Format::kHiF8, x.data(), x.size(), 1.0f, z.data());
  EXPECT_EQ(z[2], -3.25f);  // 3.3 in the E=1 binade (step 0.25)
}

}  // namespace
}  // namespace fp8tron::fp8
