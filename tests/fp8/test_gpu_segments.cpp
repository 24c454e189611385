// The grouped (segmented) quantize kernel against the CPU reference, bit for bit: every kind
// (delayed, current, 1x128 / 128x128 blockwise, MXFP8) and format, both copies or one, empty and
// unaligned segments, partial column tiles, more segments than one launch takes; the fused column
// sums within fp32 reordering; the SwiGLU prologues against the dense SwiGLU casts; and the kernel's
// bandwidth on MoE-sized inputs ("[fp8-bench]").
#include <gtest/gtest.h>

#include <cmath>
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "fp8/format_codec.h"
#include "fp8/quantize.h"
#include "fp8/quantize_reference.h"
#include "gpu_test_util.h"
#include "segment_test_util.h"

namespace fp8tron::fp8 {
namespace {

using testing::DeviceBuffer;
using testing::HostSegments;
using testing::random_bf16;

// Device twin of a HostSegments, initialised from it (0xEE codes and scales, its scales/amaxes).
struct DeviceSegments {
  DeviceBuffer<uint8_t> data, data_t, scale_inv, scale_inv_t;
  DeviceBuffer<float> scale, amax, column_sums;
  SegmentedFp8View view;

  explicit DeviceSegments(const HostSegments& h)
      : data(h.data.size(), 0xEE),
        data_t(h.data_t.size(), 0xEE),
        scale_inv(h.scale_inv.size(), 0xEE),
        scale_inv_t(h.scale_inv_t.size(), 0xEE),
        scale(h.scale),
        amax(h.amax),
        column_sums(h.column_sums) {
    view = h.view;
    view.data = h.view.data ? data.get() : nullptr;
    view.data_t = h.view.data_t ? data_t.get() : nullptr;
    view.scale_inv = scale_inv.get();
    view.scale_inv_t = h.view.scale_inv_t ? scale_inv_t.get() : nullptr;
    view.scale = scale.get();
    view.amax = amax.get();
  }
};

size_t count_mismatches(const std::vector<uint8_t>& got, const std::vector<uint8_t>& want, const std::string& what) {
  EXPECT_EQ(got.size(), want.size()) << what;
  size_t bad = 0;
  for (size_t i = 0; i < std::min(got.size(), want.size()); ++i) {
    if (got[i] != want[i] && bad++ < 5)
      ADD_FAILURE() << what << ": byte " << i << " GPU 0x" << std::hex << int(got[i]) << " CPU 0x" << int(want[i]);
  }
  EXPECT_EQ(bad, 0u) << what;
  return bad;
}

void expect_same_floats(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_EQ(codec::float_bits(got[i]), codec::float_bits(want[i])) << what << " element " << i;
}

struct KindCase {
  SegmentCast::Kind kind;
  ScalingMode mode;
  Format format;
};

std::string describe(const KindCase& k) {
  const char* kinds[] = {"delayed", "current", "blockwise", "mxfp8"};
  return std::string(kinds[int(k.kind)]) + " " + scaling_mode_name(k.mode) + " " + format_name(k.format);
}

// Runs one case on both sides and compares everything the cast writes.
void check_case(const KindCase& k, size_t cols, const std::vector<int64_t>& rows, size_t align, bool rowwise,
                bool transposed, uint32_t seed) {
  const std::string what = describe(k) + " cols " + std::to_string(cols) + " segments " + std::to_string(rows.size()) +
                           (rowwise ? " rowwise" : "") + (transposed ? " transposed" : "");
  SCOPED_TRACE(what);
  const size_t stride = k.kind == SegmentCast::Kind::kCurrent ? 1 : 3;
  HostSegments cpu(k.mode, k.format, cols, rows, align, rowwise, transposed, stride);
  for (size_t e = 0; e < rows.size(); ++e) {
    cpu.scale[e * stride] = max_finite(k.format) / (3.0f + float(e % 7));  // delayed: given
    cpu.amax[e * stride] = k.kind == SegmentCast::Kind::kDelayed ? 0.125f : 0.0f;  // delayed: accumulates
  }
  HostSegments gpu(k.mode, k.format, cols, rows, align, rowwise, transposed, stride);
  gpu.scale = cpu.scale;
  gpu.amax = cpu.amax;
  const auto x = random_bf16(cpu.layout.total_rows() * cols, seed, 1.5f, 6);
  SegmentCast cast;
  cast.kind = k.kind;
  cast.current = CurrentScalingOptions{seed % 2 == 0, 0.0f};
  cast.block = BlockScalingOptions{seed % 2 == 1, 0.0f};
  const bool tensor = k.mode == ScalingMode::kTensor;
  if (tensor) cast.column_sums = cpu.column_sums.data();
  reference::quantize_segments(x.data(), cpu.layout, cpu.view, cast);

  DeviceBuffer<uint16_t> dx(x);
  DeviceSegments d(gpu);
  if (tensor) cast.column_sums = d.column_sums.get();
  quantize_segments(dx.get(), gpu.layout, d.view, cast, nullptr);
  FP8TRON_CUDA_CHECK(cudaDeviceSynchronize());
  count_mismatches(d.data.download(), cpu.data, "data");
  count_mismatches(d.data_t.download(), cpu.data_t, "data_t");
  count_mismatches(d.scale_inv.download(), cpu.scale_inv, "scale_inv");
  count_mismatches(d.scale_inv_t.download(), cpu.scale_inv_t, "scale_inv_t");
  expect_same_floats(d.scale.download(), cpu.scale, "scale");
  expect_same_floats(d.amax.download(), cpu.amax, "amax");
  if (tensor) {
    const auto sums = d.column_sums.download();
    double worst = 0;
    for (size_t i = 0; i < sums.size(); ++i)
      worst = std::max(worst, std::fabs(double(sums[i]) - double(cpu.column_sums[i])) / (1.0 + std::fabs(cpu.column_sums[i])));
    // fp32 sums of up to 200 rows of |x| < 9 in another order (atomics): each partial sum rounds
    // at 2^-24 relative, so up to ~200 x 6e-8 x the running magnitude; 1e-4 is that bound.
    EXPECT_LT(worst, 1e-4) << "column sums (atomic adds in another order)";
  }
}

const KindCase kKinds[] = {
    {SegmentCast::Kind::kDelayed, ScalingMode::kTensor, Format::kE4M3},
    {SegmentCast::Kind::kDelayed, ScalingMode::kTensor, Format::kE5M2},
    {SegmentCast::Kind::kDelayed, ScalingMode::kTensor, Format::kHiF8},
    {SegmentCast::Kind::kCurrent, ScalingMode::kTensor, Format::kE4M3},
    {SegmentCast::Kind::kCurrent, ScalingMode::kTensor, Format::kE5M2},
    {SegmentCast::Kind::kCurrent, ScalingMode::kTensor, Format::kHiF8},
    {SegmentCast::Kind::kBlockwise, ScalingMode::kBlock1x128, Format::kE4M3},
    {SegmentCast::Kind::kBlockwise, ScalingMode::kBlock1x128, Format::kE5M2},
    {SegmentCast::Kind::kBlockwise, ScalingMode::kBlock128x128, Format::kE4M3},
    {SegmentCast::Kind::kMxfp8, ScalingMode::kMxfp8, Format::kE4M3},
    {SegmentCast::Kind::kMxfp8, ScalingMode::kMxfp8, Format::kE5M2},
};

TEST(GpuSegments, EveryKindMatchesTheReference) {
  FP8_REQUIRE_GPU();
  uint32_t seed = 500;
  for (const KindCase& k : kKinds) {
    const size_t align = k.kind == SegmentCast::Kind::kMxfp8 ? 32 : 16;
    for (auto [rowwise, transposed] : {std::pair{true, true}, std::pair{true, false}, std::pair{false, true}}) {
      // Empty, tiny, aligned, multi-tile and unaligned segments; 272 columns (a partial column tile).
      check_case(k, 272, {0, 5, 16, 200, 0, 33, 130}, align, rowwise, transposed, ++seed);
    }
    // More segments than one launch takes (64), some empty.
    std::vector<int64_t> many;
    for (int i = 0; i < 70; ++i) many.push_back((i * 37) % 150 == 0 ? 0 : (i * 37) % 150);
    check_case(k, 64, many, align, true, true, ++seed);
    check_case(k, 128, {0, 0, 0}, align, true, true, ++seed);  // nothing at all
  }
}

// The SwiGLU prologue (an MoE fc2's input cast from fc1's [gate | up] rows): segment e is, byte
// for byte, the dense SwiGLU cast (quantize_tensor_delayed, Prologue::kSwiglu) of its rows padded
// with zero rows, as the plain grouped cast is the plain dense cast of each padded segment.
TEST(GpuSegments, SwigluPrologueIsTheDenseSwigluCastOfEachPaddedSegment) {
  FP8_REQUIRE_GPU();
  const size_t cols = 272, stride = 3;  // a partial column tile
  const std::vector<int64_t> rows = {0, 5, 16, 200, 0, 33};
  for (Format format : {Format::kE4M3, Format::kE5M2}) {
    SCOPED_TRACE(format_name(format));
    HostSegments h(ScalingMode::kTensor, format, cols, rows, 16, true, true, stride);
    for (size_t e = 0; e < rows.size(); ++e) {
      h.scale[e * stride] = max_finite(format) / (3.0f + float(e));
      h.amax[e * stride] = 0.125f;
    }
    const SegmentLayout& l = h.layout;
    const auto x = random_bf16(l.total_rows() * 2 * cols, 77, 3.0f, 6);  // [rows, 2 cols]
    DeviceBuffer<uint16_t> dx(x);
    DeviceSegments d(h);
    SegmentCast cast;
    cast.prologue = Prologue::kSwiglu;
    quantize_segments(dx.get(), l, d.view, cast, nullptr);
    FP8TRON_CUDA_CHECK(cudaDeviceSynchronize());
    const auto data = d.data.download(), data_t = d.data_t.download(), scale_inv = d.scale_inv.download();
    const auto amax = d.amax.download();
    for (size_t e = 0; e < rows.size(); ++e) {
      if (rows[e] == 0) continue;
      SCOPED_TRACE("segment " + std::to_string(e));
      const size_t padded = l.padded[e];
      std::vector<uint16_t> xe(padded * 2 * cols, 0);  // the segment's rows, then zero rows
      std::copy(x.begin() + l.src_begin[e] * 2 * cols, x.begin() + (l.src_begin[e] + rows[e]) * 2 * cols, xe.begin());
      DeviceBuffer<uint16_t> dxe(xe);
      DeviceBuffer<uint8_t> q(padded * cols, 0xEE), qt(padded * cols, 0xEE);
      DeviceBuffer<float> scale(std::vector<float>{h.scale[e * stride]}), sinv(1, 0xEE), am(std::vector<float>{0.125f});
      Fp8TensorView v;
      v.data = q.get();
      v.data_t = qt.get();
      v.scale = scale.get();
      v.scale_inv = sinv.get();
      v.amax = am.get();
      v.format = format;
      v.rows = padded;
      v.cols = cols;
      TensorCastFusion fusion;
      fusion.prologue = Prologue::kSwiglu;
      quantize_tensor_delayed(dxe.get(), v, nullptr, fusion);
      FP8TRON_CUDA_CHECK(cudaDeviceSynchronize());
      const size_t begin = l.row_begin[e] * cols;
      count_mismatches({data.begin() + begin, data.begin() + begin + padded * cols}, q.download(), "data");
      count_mismatches({data_t.begin() + begin, data_t.begin() + begin + padded * cols}, qt.download(), "data_t");
      const std::vector<uint8_t> grouped_sinv(scale_inv.begin() + l.scale_begin[e] * 4,
                                              scale_inv.begin() + l.scale_begin[e] * 4 + 4);
      const auto dense_sinv = sinv.download();
      const auto* bytes = reinterpret_cast<const uint8_t*>(dense_sinv.data());
      count_mismatches(grouped_sinv, {bytes, bytes + 4}, "scale_inv");
      expect_same_floats({amax[e * stride]}, am.download(), "amax");
    }
  }
}

// The SwiGLU-backward prologue (an MoE fc1's gradient cast from the SwiGLU output's gradient and
// fc1's output h): segment e is, byte for byte, the dense kSwigluBackward cast of its rows padded
// with zero rows, column sums (the bias gradients) within fp32 reordering.
TEST(GpuSegments, SwigluBackwardPrologueIsTheDenseCastOfEachPaddedSegment) {
  FP8_REQUIRE_GPU();
  const size_t cols = 512, half = cols / 2, stride = 2;  // h's width: each half two whole tiles
  const std::vector<int64_t> rows = {0, 5, 16, 200, 0, 33};
  HostSegments h(ScalingMode::kTensor, Format::kE5M2, cols, rows, 16, true, true, stride);
  for (size_t e = 0; e < rows.size(); ++e) {
    h.scale[e * stride] = max_finite(Format::kE5M2) / (2.0f + float(e));
    h.amax[e * stride] = 0.0f;
  }
  const SegmentLayout& l = h.layout;
  const auto dy = random_bf16(l.total_rows() * half, 91, 1.0f, 4);   // [rows, cols / 2]
  const auto act_in = random_bf16(l.total_rows() * cols, 92, 2.0f);  // h = [gate | up], [rows, cols]
  DeviceBuffer<uint16_t> ddy(dy), dh(act_in);
  DeviceSegments d(h);
  SegmentCast cast;
  cast.prologue = Prologue::kSwigluBackward;
  cast.aux = dh.get();
  cast.column_sums = d.column_sums.get();
  quantize_segments(ddy.get(), l, d.view, cast, nullptr);
  FP8TRON_CUDA_CHECK(cudaDeviceSynchronize());
  const auto data = d.data.download(), data_t = d.data_t.download(), scale_inv = d.scale_inv.download();
  const auto amax = d.amax.download(), sums = d.column_sums.download();
  for (size_t e = 0; e < rows.size(); ++e) {
    if (rows[e] == 0) continue;
    SCOPED_TRACE("segment " + std::to_string(e));
    const size_t padded = l.padded[e], src = l.src_begin[e], n = size_t(rows[e]);
    std::vector<uint16_t> dye(padded * half, 0), he(padded * cols, 0);  // the rows, then zero rows
    std::copy(dy.begin() + src * half, dy.begin() + (src + n) * half, dye.begin());
    std::copy(act_in.begin() + src * cols, act_in.begin() + (src + n) * cols, he.begin());
    DeviceBuffer<uint16_t> ddye(dye), dhe(he);
    DeviceBuffer<uint8_t> q(padded * cols, 0xEE), qt(padded * cols, 0xEE);
    DeviceBuffer<float> scale(std::vector<float>{h.scale[e * stride]}), sinv(1, 0xEE), am(std::vector<float>{0.0f});
    DeviceBuffer<float> dense_sums(std::vector<float>(cols, 0.0f));
    Fp8TensorView v;
    v.data = q.get();
    v.data_t = qt.get();
    v.scale = scale.get();
    v.scale_inv = sinv.get();
    v.amax = am.get();
    v.format = Format::kE5M2;
    v.rows = padded;
    v.cols = cols;
    TensorCastFusion fusion;
    fusion.prologue = Prologue::kSwigluBackward;
    fusion.aux = dhe.get();
    fusion.column_sums = dense_sums.get();
    quantize_tensor_delayed(ddye.get(), v, nullptr, fusion);
    FP8TRON_CUDA_CHECK(cudaDeviceSynchronize());
    const size_t begin = l.row_begin[e] * cols;
    count_mismatches({data.begin() + begin, data.begin() + begin + padded * cols}, q.download(), "data");
    count_mismatches({data_t.begin() + begin, data_t.begin() + begin + padded * cols}, qt.download(), "data_t");
    const auto dense_sinv = sinv.download();
    const auto* bytes = reinterpret_cast<const uint8_t*>(dense_sinv.data());
    count_mismatches({scale_inv.begin() + l.scale_begin[e] * 4, scale_inv.begin() + l.scale_begin[e] * 4 + 4},
                     {bytes, bytes + 4}, "scale_inv");
    expect_same_floats({amax[e * stride]}, am.download(), "amax");
    EXPECT_GT(amax[e * stride], 0.0f);
    const auto want_sums = dense_sums.download();
    double worst = 0;
    for (size_t c = 0; c < cols; ++c)
      worst = std::max(worst, std::fabs(double(sums[e * cols + c]) - want_sums[c]) / (1.0 + std::fabs(want_sums[c])));
    EXPECT_LT(worst, 1e-4) << "column sums";
  }
}

// Bandwidth of the grouped cast (both copies, delayed scaling) on the MoE benchmark shapes: bytes
// read (bf16) and written (two FP8 copies) per second.
TEST(GpuSegments, Bandwidth) {
  FP8_REQUIRE_GPU();
  struct Shape {
    int experts;
    int64_t tokens, cols;
  };
  for (const Shape s : {Shape{8, 4096, 2048}, Shape{64, 1536, 2048}, Shape{64, 1536, 1408}}) {
    const std::vector<int64_t> rows(size_t(s.experts), s.tokens);
    HostSegments h(ScalingMode::kTensor, Format::kE4M3, size_t(s.cols), rows, 16, true, true);
    for (auto& v : h.scale) v = 1.0f;
    const size_t n = h.layout.total_rows() * size_t(s.cols);
    DeviceBuffer<uint16_t> dx(random_bf16(n, 9));
    DeviceSegments d(h);
    SegmentCast cast;
    const double ms = testing::time_ms([&] { quantize_segments(dx.get(), h.layout, d.view, cast, nullptr); });
    const double gbs = double(n) * (2 + 2) / (ms * 1e-3) / 1e9;
    std::printf("[fp8-bench] grouped cast %d x %lld x %lld (both copies, delayed): %.3f ms, %.0f GB/s\n", s.experts,
                (long long)s.tokens, (long long)s.cols, ms, gbs);
    EXPECT_GT(gbs, 1000.0);  // a floor; the dense fused cast+transpose reaches 2.5 TB/s (test_gpu_quantize)
  }
}

}  // namespace
}  // namespace fp8tron::fp8
