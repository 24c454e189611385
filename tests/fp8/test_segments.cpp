// Grouped tensors on the CPU: the padded segment layout (hand-computed offsets), the reference
// grouped quantizer against the dense one (each segment's codes are those of its own rows, the
// padding holds zero codes, each segment has its own scales and amax), and the GEMM plan buckets.
#include <gtest/gtest.h>

#include <vector>

#include "fp8/gemm.h"
#include "fp8/quantize.h"
#include "fp8/quantize_reference.h"
#include "fp8/segments.h"
#include "fp8_test_util.h"
#include "segment_test_util.h"

namespace fp8tron::fp8 {
namespace {

using testing::HostQuantized;
using testing::HostSegments;
using testing::random_bf16;

TEST(SegmentLayout, PaddedOffsetsAndScaleGrids) {
  // 272 columns: three 128-column blocks (the last partial).
  const SegmentLayout l = make_segment_layout(ScalingMode::kBlock1x128, 272, {5, 0, 19, 130}, 16);
  EXPECT_EQ(l.padded, (std::vector<size_t>{16, 0, 32, 144}));
  EXPECT_EQ(l.src_begin, (std::vector<size_t>{0, 5, 5, 24, 154}));
  EXPECT_EQ(l.row_begin, (std::vector<size_t>{0, 16, 16, 48, 192}));
  EXPECT_EQ(l.tile_begin, (std::vector<size_t>{0, 1, 1, 2, 4}));
  // Row-wise 1x128 grids: 3 column blocks x padded rows.
  EXPECT_EQ(l.scale_begin, (std::vector<size_t>{0, 48, 48, 144, 576}));
  // Transposed copies [272, padded]: ceil(padded / 128) blocks x 272 columns.
  EXPECT_EQ(l.scale_t_begin, (std::vector<size_t>{0, 272, 272, 544, 1088}));
  EXPECT_TRUE(l.padding());
  // Every block grid starts 16-byte aligned (cuBLASLt's requirement for scale pointers).
  for (size_t e = 0; e < l.segments(); ++e) {
    EXPECT_EQ(l.scale_begin[e] % 4, 0u);
    EXPECT_EQ(l.scale_t_begin[e] % 4, 0u);
  }
  const SegmentLayout t = make_segment_layout(ScalingMode::kTensor, 64, {0, 32, 7}, 32);
  EXPECT_EQ(t.padded, (std::vector<size_t>{0, 32, 32}));
  EXPECT_EQ(t.scale_begin, (std::vector<size_t>{0, 4, 8, 12}));  // one scale per segment, empty or not, 16 bytes apart
  EXPECT_FALSE(make_segment_layout(ScalingMode::kTensor, 64, {16, 48}, 16).padding());
}

TEST(SegmentLayout, SegmentViewsPointIntoTheCopies) {
  HostSegments h(ScalingMode::kBlock1x128, Format::kE4M3, 272, {5, 0, 19, 130}, 16, true, true);
  const Fp8TensorView v = segment_view(h.view, h.layout, 3);
  EXPECT_EQ(v.rows, 144u);
  EXPECT_EQ(v.cols, 272u);
  EXPECT_EQ(static_cast<uint8_t*>(v.data), h.data.data() + 48 * 272);
  EXPECT_EQ(static_cast<uint8_t*>(v.data_t), h.data_t.data() + 48 * 272);
  EXPECT_EQ(static_cast<uint8_t*>(v.scale_inv), h.scale_inv.data() + 144 * 4);
  EXPECT_EQ(static_cast<uint8_t*>(v.scale_inv_t), h.scale_inv_t.data() + 544 * 4);
  EXPECT_EQ(v.scale, h.scale.data() + 3 * 3);
}

// Each segment of the reference grouped cast holds what the dense cast of its own rows holds,
// followed by zero codes; delayed scales and amaxes are the segment's own (strided slots).
TEST(ReferenceSegments, EachSegmentIsItsOwnRowsThenZeros) {
  const size_t cols = 48;
  const std::vector<int64_t> rows = {5, 0, 19, 16};
  size_t total = 0;
  for (auto r : rows) total += size_t(r);
  const auto x = random_bf16(total * cols, 17, 2.0f, 4);
  HostSegments h(ScalingMode::kTensor, Format::kE4M3, cols, rows, 16, true, true);
  for (size_t e = 0; e < rows.size(); ++e) {
    h.scale[3 * e] = 100.0f / float(e + 1);
    h.amax[3 * e] = 0.5f;
  }
  SegmentCast cast;
  cast.kind = SegmentCast::Kind::kDelayed;
  cast.column_sums = h.column_sums.data();
  reference::quantize_segments(x.data(), h.layout, h.view, cast);
  size_t src = 0;
  for (size_t e = 0; e < rows.size(); ++e) {
    SCOPED_TRACE("segment " + std::to_string(e));
    const size_t m = size_t(rows[e]), padded = h.layout.padded[e], begin = h.layout.row_begin[e];
    if (m == 0) {
      EXPECT_EQ(h.amax[3 * e], 0.5f);  // untouched
      continue;
    }
    HostQuantized dense(ScalingMode::kTensor, Format::kE4M3, m, cols, true, true);
    dense.scale = h.scale[3 * e];
    reference::quantize_tensor_delayed(x.data() + src * cols, dense.view);
    EXPECT_EQ(h.amax[3 * e], std::max(0.5f, dense.amax));
    EXPECT_EQ(reinterpret_cast<const float*>(h.scale_inv.data())[h.layout.scale_begin[e]], dense.sinv(0));
    for (size_t r = 0; r < padded; ++r) {
      for (size_t c = 0; c < cols; ++c) {
        const uint8_t want = r < m ? dense.data[r * cols + c] : 0;
        ASSERT_EQ(h.data[(begin + r) * cols + c], want) << r << "," << c;
        ASSERT_EQ(h.data_t[begin * cols + c * padded + r], want) << r << "," << c;  // [cols, padded]
      }
    }
    for (size_t c = 0; c < cols; ++c) {
      float sum = 0.0f;
      for (size_t r = 0; r < m; ++r) sum += codec::bf16_to_float(x[(src + r) * cols + c]);
      EXPECT_EQ(h.column_sums[e * cols + c], sum);
    }
    src += m;
  }
}

// Current scaling: each segment's scale comes from its own amax.
TEST(ReferenceSegments, CurrentScalingPerSegment) {
  const size_t cols = 32;
  const std::vector<int64_t> rows = {16, 3};
  std::vector<uint16_t> x(19 * cols);
  for (size_t i = 0; i < x.size(); ++i) x[i] = codec::float_to_bf16(i < 16 * cols ? 1.0f : 100.0f);
  HostSegments h(ScalingMode::kTensor, Format::kE4M3, cols, rows, 16, true, false, 1);
  SegmentCast cast;
  cast.kind = SegmentCast::Kind::kCurrent;
  reference::quantize_segments(x.data(), h.layout, h.view, cast);
  EXPECT_EQ(h.amax[0], 1.0f);
  EXPECT_EQ(h.amax[1], 100.0f);
  EXPECT_EQ(h.scale[0], 448.0f);
  EXPECT_EQ(h.scale[1], 4.48f);
}

TEST(GemmBucket, QuarterOctaveStepsFrom128) {
  EXPECT_EQ(gemm_bucket(1), 128);
  EXPECT_EQ(gemm_bucket(128), 128);
  EXPECT_EQ(gemm_bucket(129), 160);
  EXPECT_EQ(gemm_bucket(1000), 1024);
  EXPECT_EQ(gemm_bucket(1025), 1280);
  EXPECT_EQ(gemm_bucket(1536), 1536);
  EXPECT_EQ(gemm_bucket(1537), 1792);
  EXPECT_EQ(gemm_bucket(4096), 4096);
  EXPECT_EQ(gemm_bucket(4097), 5120);
  for (int64_t v = 1; v < 100000; v += 37) {
    const int64_t b = gemm_bucket(v);
    EXPECT_GE(b, v);
    EXPECT_LE(b, std::max<int64_t>(128, v + v / 4 + 1)) << v;  // at most a quarter above
  }
}

}  // namespace
}  // namespace fp8tron::fp8
