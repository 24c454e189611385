// CPU reference quantizers: scale layouts (block-scale shapes), per-tensor delayed and current
// scaling, 1x128 / 128x128 blocks, MXFP8 with E8M0 scales, dequantization. The GPU tests use these
// as the oracle, so their own semantics are pinned down here.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "fp8/format_codec.h"
#include "fp8/formats.h"
#include "fp8/quantize_reference.h"
#include "fp8/scale_math.h"
#include "fp8_test_util.h"

namespace fp8tron::fp8 {
namespace {

using codec::bf16_to_float;

using testing::HostQuantized;
using testing::random_bf16;

TEST(ScaleLayout, BlockScaleShapes) {
  ScaleLayout l = scale_layout(ScalingMode::kTensor, 1000, 1000);
  EXPECT_EQ(l.elements(), 1u);
  // 1x128: one scale per row per 128 columns, rows padded to 4 ("M-major").
  l = scale_layout(ScalingMode::kBlock1x128, 300, 520);
  EXPECT_EQ(l.outer, 5u);
  EXPECT_EQ(l.inner, 300u);
  EXPECT_EQ(l.ld, 300u);
  l = scale_layout(ScalingMode::kBlock1x128, 301, 128);
  EXPECT_EQ(l.outer, 1u);
  EXPECT_EQ(l.ld, 304u);
  EXPECT_EQ(l.bytes(), 304u * 4);
  EXPECT_EQ(scale_index(ScalingMode::kBlock1x128, l, 7, 127), 7u);
  l = scale_layout(ScalingMode::kBlock1x128, 301, 520);
  EXPECT_EQ(scale_index(ScalingMode::kBlock1x128, l, 7, 128), 304u + 7);
  // 128x128: block rows x block cols, block cols padded to 4.
  l = scale_layout(ScalingMode::kBlock128x128, 300, 520);
  EXPECT_EQ(l.outer, 3u);
  EXPECT_EQ(l.inner, 5u);
  EXPECT_EQ(l.ld, 8u);
  EXPECT_EQ(scale_index(ScalingMode::kBlock128x128, l, 299, 519), 2u * 8 + 4);
  // The transposed copy's layout is the layout of the transposed shape.
  const ScaleLayout lt = scale_layout(ScalingMode::kBlock128x128, 520, 300);
  EXPECT_EQ(lt.outer, 5u);
  EXPECT_EQ(lt.ld, 4u);
  // MXFP8: one E8M0 byte per 32 columns.
  l = scale_layout(ScalingMode::kMxfp8, 64, 100);
  EXPECT_EQ(l.inner, 4u);
  EXPECT_EQ(l.ld, 4u);
  EXPECT_EQ(l.element_bytes, 1u);
  EXPECT_EQ(l.bytes(), 256u);
  EXPECT_EQ(scale_index(ScalingMode::kMxfp8, l, 2, 65), 2u * 4 + 2);
}

TEST(ReferenceQuantize, DelayedTensorCast) {
  const size_t rows = 48, cols = 80;
  const auto x = random_bf16(rows * cols, 1);
  HostQuantized q(ScalingMode::kTensor, Format::kE4M3, rows, cols);
  q.scale = 37.5f;
  q.amax = 0.5f;
  reference::quantize_tensor_delayed(x.data(), q.view);
  float amax = 0.5f;
  for (size_t r = 0; r < rows; ++r) {
    for (size_t c = 0; c < cols; ++c) {
      const float v = bf16_to_float(x[r * cols + c]);
      amax = std::fmax(amax, std::fabs(v));
      const uint8_t expected = encode(Format::kE4M3, v * 37.5f);
      EXPECT_EQ(q.data[r * cols + c], expected);
      EXPECT_EQ(q.data_t[c * rows + r], expected);
    }
  }
  EXPECT_EQ(q.amax, amax);  // max-accumulated into the existing value
  EXPECT_EQ(q.sinv(0), 1.0f / 37.5f);
}

TEST(ReferenceQuantize, CurrentScalingMapsAmaxToMax) {
  for (Format f : {Format::kE4M3, Format::kE5M2, Format::kHiF8}) {
    const size_t rows = 32, cols = 64;
    const auto x = random_bf16(rows * cols, 2, 3.0f);
    HostQuantized q(ScalingMode::kTensor, f, rows, cols);
    q.amax = 1e9f;  // overwritten, not accumulated
    reference::quantize_tensor_current(x.data(), q.view, {});
    const float amax = reference::amax_bf16(x.data(), x.size());
    EXPECT_EQ(q.amax, amax);
    EXPECT_EQ(q.scale, max_finite(f) / amax);
    EXPECT_EQ(q.sinv(0), 1.0f / q.scale);
    float max_decoded = 0.0f;
    for (uint8_t c : q.data) max_decoded = std::fmax(max_decoded, std::fabs(decode(f, c)));
    EXPECT_EQ(max_decoded, max_finite(f)) << format_name(f);
    // Dequantized values are close: relative error within half an ulp of the coarsest precision
    // the format uses in the populated range (E5M2: 2 bits; HiF8 near the top: 1 bit).
    std::vector<float> y(x.size());
    reference::dequantize_to_float(q.view, false, y.data());
    const float rel = f == Format::kE4M3 ? 1.0f / 16 : f == Format::kE5M2 ? 1.0f / 8 : 1.0f / 4;
    for (size_t i = 0; i < x.size(); ++i) {
      const float v = bf16_to_float(x[i]);
      if (std::fabs(v * q.scale) >= format_info(f).min_normal * 4) {
        EXPECT_NEAR(y[i], v, rel * std::fabs(v)) << format_name(f) << " element " << i;
      }
    }
  }
}

TEST(ReferenceQuantize, PowerOfTwoCurrentScales) {
  const auto x = random_bf16(16 * 16, 3);
  HostQuantized q(ScalingMode::kTensor, Format::kE4M3, 16, 16);
  reference::quantize_tensor_current(x.data(), q.view, {true, 0.0f});
  int exp = 0;
  EXPECT_EQ(std::frexp(q.scale, &exp), 0.5f);
  EXPECT_LE(q.scale * q.amax, 448.0f);
  EXPECT_GT(q.scale * q.amax, 224.0f);
}

// The amax rule (scale_math.h): NaNs, quiet or signaling, are ignored; inf propagates. The GPU
// kernels use fmaxf, which behaves this way; glibc's std::fmax does not for signaling NaNs (it
// returned NaN on 0x7F81, and the next fmax dropped that NaN together with the inf seen earlier).
TEST(ReferenceQuantize, AmaxIgnoresNansAndKeepsInf) {
  const uint16_t kInf = 0x7F80, kSNaN = 0x7F81, kQNaN = 0x7FC0, kNegSNaN = 0xFF81, kNegInf = 0xFF80;
  const uint16_t two = codec::float_to_bf16(2.0f), minus_three = codec::float_to_bf16(-3.0f);
  auto amax = [](std::vector<uint16_t> v) { return reference::amax_bf16(v.data(), v.size()); };
  EXPECT_EQ(amax({two, kSNaN, minus_three, kQNaN}), 3.0f);
  EXPECT_EQ(amax({kSNaN, kNegSNaN, kQNaN}), 0.0f);  // nothing but NaNs: the running value (0)
  EXPECT_EQ(amax({kInf, kSNaN, two}), std::numeric_limits<float>::infinity());
  EXPECT_EQ(amax({two, kNegInf, kNegSNaN}), std::numeric_limits<float>::infinity());
  EXPECT_EQ(max_ignoring_nan(1.0f, std::numeric_limits<float>::quiet_NaN()), 1.0f);
  EXPECT_EQ(max_ignoring_nan(std::numeric_limits<float>::quiet_NaN(), 1.0f), 1.0f);
  EXPECT_EQ(amax_fold(0.0f, -0.0f), 0.0f);
  // Every bf16 pattern in order (the GPU test's input): inf is the amax.
  std::vector<uint16_t> all(65536);
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<uint16_t>(i);
  EXPECT_EQ(codec::float_bits(reference::amax_bf16(all.data(), all.size())), codec::kF32Inf);
  HostQuantized q(ScalingMode::kTensor, Format::kE4M3, 256, 256, true, false);
  q.scale = 1.0f;
  reference::quantize_tensor_delayed(all.data(), q.view);  // max-accumulates into q.amax (0)
  EXPECT_EQ(codec::float_bits(q.amax), codec::kF32Inf);
  // Block modes: a NaN inside a block does not decide its scale; the finite values do.
  std::vector<uint16_t> x(16 * 128, codec::float_to_bf16(1.0f));
  x[5] = kSNaN;
  x[7] = codec::float_to_bf16(-7.0f);
  HostQuantized b(ScalingMode::kBlock1x128, Format::kE4M3, 16, 128);
  reference::quantize_blockwise(x.data(), b.view, {false, 0.0f});
  EXPECT_EQ(b.sinv(0), 1.0f / (448.0f / 7.0f));
  EXPECT_TRUE(is_nan_code(Format::kE4M3, b.data[5]));
}

TEST(ReferenceQuantize, ZeroTensorGetsUnitScale) {
  std::vector<uint16_t> x(32 * 32, 0);
  HostQuantized q(ScalingMode::kTensor, Format::kE4M3, 32, 32);
  reference::quantize_tensor_current(x.data(), q.view, {});
  EXPECT_EQ(q.scale, 1.0f);
  for (uint8_t c : q.data) EXPECT_EQ(c, 0);
}

TEST(ReferenceQuantize, Blockwise1x128) {
  const size_t rows = 160, cols = 384;
  auto x = random_bf16(rows * cols, 4);
  // Make blocks differ wildly in magnitude.
  for (size_t r = 0; r < rows; ++r) {
    for (size_t c = 0; c < cols; ++c) {
      const float f = bf16_to_float(x[r * cols + c]) * std::ldexp(1.0f, static_cast<int>((r + 3 * (c / 128)) % 9) - 4);
      x[r * cols + c] = codec::float_to_bf16(f);
    }
  }
  HostQuantized q(ScalingMode::kBlock1x128, Format::kE4M3, rows, cols);
  reference::quantize_blockwise(x.data(), q.view, {});
  const ScaleLayout l = q.view.layout(), lt = q.view.layout_t();
  // Row-wise: every 1x128 run's amax lands in (224, 448] with power-of-two scales.
  for (size_t r = 0; r < rows; ++r) {
    for (size_t kb = 0; kb < cols / 128; ++kb) {
      float amax = 0.0f;
      for (size_t c = kb * 128; c < (kb + 1) * 128; ++c) amax = std::fmax(amax, std::fabs(bf16_to_float(x[r * cols + c])));
      const float sinv = q.sinv(scale_index(ScalingMode::kBlock1x128, l, r, kb * 128));
      EXPECT_EQ(sinv, 1.0f / std::ldexp(1.0f, std::ilogb(448.0f / amax)));  // power-of-two scale
      EXPECT_LE(amax / sinv, 448.0f);
      EXPECT_GT(amax / sinv, 224.0f);
    }
  }
  // Transposed copy: 1x128 runs along the rows of x^T, i.e. down the columns of x.
  std::vector<float> yt(rows * cols);
  reference::dequantize_to_float(q.view, true, yt.data());
  for (size_t c = 0; c < cols; ++c) {
    for (size_t rb = 0; rb < ceil_div(rows, 128); ++rb) {
      float amax = 0.0f;
      for (size_t r = rb * 128; r < std::min(rows, (rb + 1) * 128); ++r) {
        amax = std::fmax(amax, std::fabs(bf16_to_float(x[r * cols + c])));
      }
      const float sinv = q.sinv_t(scale_index(ScalingMode::kBlock1x128, lt, c, rb * 128));
      EXPECT_LE(amax / sinv, 448.0f);
      EXPECT_GT(amax / sinv, 224.0f);
      // Half an ulp: relative for normal codes, half the subnormal step (2^-10) times sinv below.
      for (size_t r = rb * 128; r < std::min(rows, (rb + 1) * 128); ++r) {
        const float v = bf16_to_float(x[r * cols + c]);
        EXPECT_NEAR(yt[c * rows + r], v, std::fabs(v) / 16 + sinv * 0.0009765625f);
      }
    }
  }
}

TEST(ReferenceQuantize, Blockwise128x128SharesScalesBetweenCopies) {
  const size_t rows = 272, cols = 400;  // partial blocks on both edges
  const auto x = random_bf16(rows * cols, 5);
  HostQuantized q(ScalingMode::kBlock128x128, Format::kE4M3, rows, cols);
  reference::quantize_blockwise(x.data(), q.view, {false, 0.0f});
  for (size_t r = 0; r < rows; ++r) {
    for (size_t c = 0; c < cols; ++c) EXPECT_EQ(q.data_t[c * rows + r], q.data[r * cols + c]);
  }
  const ScaleLayout l = q.view.layout(), lt = q.view.layout_t();
  for (size_t rb = 0; rb < ceil_div(rows, 128); ++rb) {
    for (size_t cb = 0; cb < ceil_div(cols, 128); ++cb) {
      EXPECT_EQ(q.sinv(rb * l.ld + cb), q.sinv_t(cb * lt.ld + rb));
      float amax = 0.0f;
      for (size_t r = rb * 128; r < std::min(rows, rb * 128 + 128); ++r) {
        for (size_t c = cb * 128; c < std::min(cols, cb * 128 + 128); ++c) {
          amax = std::fmax(amax, std::fabs(bf16_to_float(x[r * cols + c])));
        }
      }
      EXPECT_EQ(q.sinv(rb * l.ld + cb), 1.0f / (448.0f / amax));  // fp32 scales (power_2 off)
    }
  }
}

TEST(ReferenceQuantize, Mxfp8E8M0Scales) {
  const size_t rows = 64, cols = 96;
  auto x = random_bf16(rows * cols, 6);
  x[5] = codec::float_to_bf16(448.0f * 4);  // a block whose amax is exactly max * 2^2
  HostQuantized q(ScalingMode::kMxfp8, Format::kE4M3, rows, cols);
  reference::quantize_mxfp8(x.data(), q.view);
  const ScaleLayout l = q.view.layout();
  EXPECT_EQ(q.scale_inv[0], 129);  // 2^2: the amax maps exactly to 448
  EXPECT_EQ(q.data[5], 0x7E);
  for (size_t r = 0; r < rows; ++r) {
    for (size_t b = 0; b < cols / 32; ++b) {
      float amax = 0.0f;
      for (size_t c = 32 * b; c < 32 * b + 32; ++c) amax = std::fmax(amax, std::fabs(bf16_to_float(x[r * cols + c])));
      const float s = decode(Format::kE8M0, q.scale_inv[r * l.ld + b]);
      EXPECT_LE(amax / s, 448.0f);
      EXPECT_GT(amax / s, 224.0f);  // the smallest power of two that fits
    }
  }
  // The transposed copy has 32x1 blocks of x: decodes to x^T within E4M3 precision.
  std::vector<float> yt(rows * cols);
  reference::dequantize_to_float(q.view, true, yt.data());
  for (size_t r = 0; r < rows; ++r) {
    for (size_t c = 0; c < cols; ++c) {
      const float v = bf16_to_float(x[r * cols + c]);
      EXPECT_NEAR(yt[c * rows + r], v, std::fabs(v) / 16 + 1e-2f);
    }
  }
}

TEST(ReferenceQuantize, DequantizeRoundsToBf16) {
  const auto x = random_bf16(32 * 32, 7);
  HostQuantized q(ScalingMode::kTensor, Format::kHiF8, 32, 32);
  reference::quantize_tensor_current(x.data(), q.view, {});
  std::vector<float> f(x.size());
  std::vector<uint16_t> h(x.size());
  reference::dequantize_to_float(q.view, false, f.data());
  reference::dequantize(q.view, false, h.data());
  for (size_t i = 0; i < x.size(); ++i) EXPECT_EQ(h[i], codec::float_to_bf16(f[i]));
  // HiF8 fake quantization in bulk matches the tensor path.
  std::vector<float> xf(x.size()), fq(x.size());
  for (size_t i = 0; i < x.size(); ++i) xf[i] = bf16_to_float(x[i]);
  fake_quantize(Format::kHiF8, xf.data(), xf.size(), q.scale, fq.data());
  for (size_t i = 0; i < x.size(); ++i) EXPECT_EQ(fq[i], f[i]);
}

}  // namespace
}  // namespace fp8tron::fp8
