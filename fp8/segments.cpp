#include "fp8/segments.h"

#include "core/error.h"
#include "core/text.h"

namespace fp8tron::fp8 {

SegmentLayout make_segment_layout(ScalingMode mode, size_t cols, const std::vector<int64_t>& rows, size_t align) {
  FP8TRON_CHECK(align > 0 && align % 16 == 0, strprintf("segment alignment %zu is not a multiple of 16", align));
  SegmentLayout l;
  l.mode = mode;
  l.cols = cols;
  const size_t n = rows.size();
  l.src_begin.assign(n + 1, 0);
  l.row_begin.assign(n + 1, 0);
  l.tile_begin.assign(n + 1, 0);
  l.scale_begin.assign(n + 1, 0);
  l.scale_t_begin.assign(n + 1, 0);
  for (size_t e = 0; e < n; ++e) {
    FP8TRON_CHECK(rows[e] >= 0, "negative segment size");
    const size_t r = size_t(rows[e]), p = padded_rows(r, align);
    l.rows.push_back(r);
    l.padded.push_back(p);
    l.src_begin[e + 1] = l.src_begin[e] + r;
    l.row_begin[e + 1] = l.row_begin[e] + p;
    l.tile_begin[e + 1] = l.tile_begin[e] + ceil_div(p, kBlockLen);
    // Tensor scaling keeps one entry per segment, empty or not, padded to 16 bytes
    // (scale_inv[4 e]): cuBLASLt refuses FP8 GEMMs whose scale pointers are not 16-byte aligned.
    const size_t grid = mode == ScalingMode::kTensor ? kTensorScaleStride : scale_layout(mode, p, cols).elements();
    const size_t grid_t = mode == ScalingMode::kTensor ? kTensorScaleStride : scale_layout(mode, cols, p).elements();
    l.scale_begin[e + 1] = l.scale_begin[e] + grid;
    l.scale_t_begin[e + 1] = l.scale_t_begin[e] + grid_t;
  }
  return l;
}

Fp8TensorView segment_view(const SegmentedFp8View& t, const SegmentLayout& l, size_t e) {
  FP8TRON_CHECK(e < l.segments(), "segment index out of range");
  Fp8TensorView v;
  v.format = t.format;
  v.scaling_mode = t.scaling_mode;
  v.rows = l.padded[e];
  v.cols = l.cols;
  const size_t code_offset = l.row_begin[e] * l.cols;
  v.data = t.data ? static_cast<uint8_t*>(t.data) + code_offset : nullptr;
  v.data_t = t.data_t ? static_cast<uint8_t*>(t.data_t) + code_offset : nullptr;
  const size_t bytes = t.scaling_mode == ScalingMode::kMxfp8 ? 1 : 4;
  v.scale_inv = t.scale_inv ? static_cast<uint8_t*>(t.scale_inv) + l.scale_begin[e] * bytes : nullptr;
  if (t.scaling_mode != ScalingMode::kTensor)
    v.scale_inv_t = t.scale_inv_t ? static_cast<uint8_t*>(t.scale_inv_t) + l.scale_t_begin[e] * bytes : nullptr;
  v.scale = t.scale ? t.scale + e * t.scale_stride : nullptr;
  v.amax = t.amax ? t.amax + e * t.amax_stride : nullptr;
  return v;
}

}  // namespace fp8tron::fp8
