// The grouped (segmented) quantize kernel against the CPU reference, bit for bit: every kind
// (delayed, current, 1x128 / 128x128 blockwise, MXFP8) and format, both copies or one, empty and
// unaligned segments, partial column tiles, more segments than one launch takes; the fused column
// sums within fp32 reordering; and the kernel's bandwidth on MoE-sized inputs ("[fp8-bench]").
#include <gtest/gtest.h>

#include <cmath>
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
