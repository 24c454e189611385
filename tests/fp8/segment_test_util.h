// Host memory for one quantized grouped tensor (fp8/segments.h), with a view pointing into it.
// Untouched bytes are 0xEE so that a kernel that forgets to write something is caught; tensor
// scales and amaxes live in strided arrays, as the engine's delayed-scaling slots do.
#pragma once
#include <cstdint>
#include <vector>

#include "fp8/quantize.h"
#include "fp8/segments.h"

namespace fp8tron::fp8::testing {

struct HostSegments {
  SegmentLayout layout;
  std::vector<uint8_t> data, data_t, scale_inv, scale_inv_t;
  std::vector<float> scale, amax, column_sums;
  SegmentedFp8View view;

  HostSegments(ScalingMode mode, Format format, size_t cols, const std::vector<int64_t>& rows, size_t align,
               bool rowwise, bool transposed, size_t stride = 3) {
    layout = make_segment_layout(mode, cols, rows, align);
    const size_t n = layout.segments(), codes = layout.total_padded() * cols;
    const size_t bytes = mode == ScalingMode::kMxfp8 ? 1 : 4;
    if (rowwise) data.assign(codes, 0xEE);
    if (transposed) data_t.assign(codes, 0xEE);
    scale_inv.assign(layout.scale_elements() * bytes, 0xEE);
    scale_inv_t.assign(layout.scale_t_elements() * bytes, 0xEE);
    scale.assign(n * stride, 0.0f);
    amax.assign(n * stride, 0.0f);
    column_sums.assign(n * cols, 0.0f);
    view.format = format;
    view.scaling_mode = mode;
    view.data = rowwise ? data.data() : nullptr;
    view.data_t = transposed ? data_t.data() : nullptr;
    view.scale_inv = scale_inv.data();
    view.scale_inv_t = mode == ScalingMode::kTensor ? nullptr : scale_inv_t.data();
    view.scale = scale.data();
    view.amax = amax.data();
    view.scale_stride = view.amax_stride = stride;
  }
  HostSegments(const HostSegments&) = delete;
  HostSegments& operator=(const HostSegments&) = delete;
};

}  // namespace fp8tron::fp8::testing
