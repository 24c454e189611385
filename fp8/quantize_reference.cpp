#include "fp8/quantize_reference.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "fp8/format_codec.h"
#include "fp8/formats.h"
#include "fp8/scale_math.h"

namespace fp8tron::fp8::reference {

namespace {

using codec::bf16_to_float;

uint8_t encode_sat(Format format, float v) { return encode(format, v, Overflow::kSaturate); }

void check_element_format(const Fp8TensorView& t, bool allow_hif8) {
  FP8TRON_CHECK(t.format == Format::kE4M3 || t.format == Format::kE5M2 || (allow_hif8 && t.format == Format::kHiF8),
                std::string("unsupported element format ") + format_name(t.format));
}

uint8_t* bytes(void* p) { return static_cast<uint8_t*>(p); }
float* floats(void* p) { return static_cast<float*>(p); }

}  // namespace

float amax_bf16(const uint16_t* x, size_t n) {
  float m = 0.0f;
  for (size_t i = 0; i < n; ++i) m = amax_fold(m, bf16_to_float(x[i]));
  return m;
}

namespace {

void cast_tensor(const uint16_t* x, const Fp8TensorView& out, float scale) {
  const size_t rows = out.rows, cols = out.cols;
  for (size_t r = 0; r < rows; ++r) {
    for (size_t c = 0; c < cols; ++c) {
      const uint8_t q = encode_sat(out.format, bf16_to_float(x[r * cols + c]) * scale);
      if (out.data) bytes(out.data)[r * cols + c] = q;
      if (out.data_t) bytes(out.data_t)[c * rows + r] = q;
    }
  }
}

// One copy quantized in 1-D runs (1x128 blocks, MX blocks): `lines` lines of `length` elements,
// value(line, i), cut into runs of `run` elements. store_scale(line, first, amax) records the
// run's scale and returns the factor its elements are multiplied by.
template <class Value, class StoreScale>
void quantize_runs(size_t lines, size_t length, size_t run, Value value, Format format, uint8_t* codes,
                   StoreScale store_scale) {
  for (size_t l = 0; l < lines; ++l) {
    for (size_t i0 = 0; i0 < length; i0 += run) {
      const size_t i1 = std::min(length, i0 + run);
      float amax = 0.0f;
      for (size_t i = i0; i < i1; ++i) amax = amax_fold(amax, value(l, i));
      const float mult = store_scale(l, i0, amax);
      for (size_t i = i0; i < i1; ++i) codes[l * length + i] = encode_sat(format, value(l, i) * mult);
    }
  }
}

}  // namespace

void quantize_tensor_delayed(const uint16_t* x, const Fp8TensorView& out) {
  FP8TRON_CHECK(out.scaling_mode == ScalingMode::kTensor && out.scale != nullptr, "delayed cast needs a tensor scale");
  check_element_format(out, true);
  const float scale = *out.scale;
  if (out.amax) *out.amax = max_ignoring_nan(*out.amax, amax_bf16(x, out.numel()));
  if (out.scale_inv) *floats(out.scale_inv) = 1.0f / scale;
  cast_tensor(x, out, scale);
}

void quantize_tensor_current(const uint16_t* x, const Fp8TensorView& out, const CurrentScalingOptions& options) {
  FP8TRON_CHECK(out.scaling_mode == ScalingMode::kTensor && out.amax != nullptr && out.scale_inv != nullptr,
                "current scaling needs amax and scale_inv");
  check_element_format(out, true);
  const float amax = amax_bf16(x, out.numel());
  *out.amax = amax;
  const float scale = scale_from_amax(amax, max_finite(out.format), options.power_2_scales, options.amax_epsilon);
  if (out.scale) *out.scale = scale;
  *floats(out.scale_inv) = 1.0f / scale;
  cast_tensor(x, out, scale);
}

void quantize_tensor_current_given_amax(const uint16_t* x, const Fp8TensorView& out, const CurrentScalingOptions& options) {
  FP8TRON_CHECK(out.scaling_mode == ScalingMode::kTensor && out.amax != nullptr && out.scale_inv != nullptr,
                "current scaling needs amax and scale_inv");
  check_element_format(out, true);
  const float scale = scale_from_amax(*out.amax, max_finite(out.format), options.power_2_scales, options.amax_epsilon);
  if (out.scale) *out.scale = scale;
  *floats(out.scale_inv) = 1.0f / scale;
  cast_tensor(x, out, scale);
}

void quantize_blockwise(const uint16_t* x, const Fp8TensorView& out, const BlockScalingOptions& options) {
  FP8TRON_CHECK(out.scaling_mode == ScalingMode::kBlock1x128 || out.scaling_mode == ScalingMode::kBlock128x128,
                "quantize_blockwise needs a 1x128 or 128x128 scaling mode");
  check_element_format(out, false);
  const size_t rows = out.rows, cols = out.cols;
  const float fp8_max = max_finite(out.format);
  auto scale_of = [&](float amax) {
    return scale_from_amax(amax, fp8_max, options.power_2_scales, options.amax_epsilon);
  };
  auto xv = [&](size_t r, size_t c) { return bf16_to_float(x[r * cols + c]); };

  if (out.scaling_mode == ScalingMode::kBlock1x128) {
    auto store = [&](void* scale_inv, const ScaleLayout& layout) {
      return [&, scale_inv, layout](size_t line, size_t first, float amax) {
        const float scale = scale_of(amax);
        floats(scale_inv)[scale_index(out.scaling_mode, layout, line, first)] = 1.0f / scale;
        return scale;
      };
    };
    // 1x128 runs along each row of x, and for the transposed copy down each column of x.
    if (out.data) quantize_runs(rows, cols, kBlockLen, xv, out.format, bytes(out.data), store(out.scale_inv, out.layout()));
    if (out.data_t) {
      auto xt = [&](size_t c, size_t r) { return xv(r, c); };
      quantize_runs(cols, rows, kBlockLen, xt, out.format, bytes(out.data_t), store(out.scale_inv_t, out.layout_t()));
    }
    return;
  }

  // 128x128: one scale per block, shared by both copies.
  const ScaleLayout layout = out.layout(), layout_t = out.layout_t();
  for (size_t r0 = 0; r0 < rows; r0 += kBlockLen) {
    for (size_t c0 = 0; c0 < cols; c0 += kBlockLen) {
      const size_t r1 = std::min(rows, r0 + kBlockLen), c1 = std::min(cols, c0 + kBlockLen);
      float amax = 0.0f;
      for (size_t r = r0; r < r1; ++r) {
        for (size_t c = c0; c < c1; ++c) amax = amax_fold(amax, xv(r, c));
      }
      const float scale = scale_of(amax), scale_inv = 1.0f / scale;
      if (out.data) floats(out.scale_inv)[scale_index(out.scaling_mode, layout, r0, c0)] = scale_inv;
      if (out.data_t) floats(out.scale_inv_t)[scale_index(out.scaling_mode, layout_t, c0, r0)] = scale_inv;
      for (size_t r = r0; r < r1; ++r) {
        for (size_t c = c0; c < c1; ++c) {
          const uint8_t q = encode_sat(out.format, xv(r, c) * scale);
          if (out.data) bytes(out.data)[r * cols + c] = q;
          if (out.data_t) bytes(out.data_t)[c * rows + r] = q;
        }
      }
    }
  }
}

void quantize_mxfp8(const uint16_t* x, const Fp8TensorView& out) {
  FP8TRON_CHECK(out.scaling_mode == ScalingMode::kMxfp8, "quantize_mxfp8 needs the MXFP8 scaling mode");
  check_element_format(out, false);
  const size_t rows = out.rows, cols = out.cols;
  const float rcp = 1.0f / max_finite(out.format);
  auto xv = [&](size_t r, size_t c) { return bf16_to_float(x[r * cols + c]); };
  auto store = [&](void* scale_inv, const ScaleLayout& layout) {
    return [&, scale_inv, layout](size_t line, size_t first, float amax) {
      const uint8_t e = mx_block_scale(amax, rcp);
      bytes(scale_inv)[scale_index(out.scaling_mode, layout, line, first)] = e;
      return codec::e8m0_reciprocal(e);
    };
  };
  if (out.data) quantize_runs(rows, cols, kMxBlock, xv, out.format, bytes(out.data), store(out.scale_inv, out.layout()));
  if (out.data_t) {
    auto xt = [&](size_t c, size_t r) { return xv(r, c); };
    quantize_runs(cols, rows, kMxBlock, xt, out.format, bytes(out.data_t), store(out.scale_inv_t, out.layout_t()));
  }
}

void quantize_segments(const uint16_t* x, const SegmentLayout& l, const SegmentedFp8View& out, const SegmentCast& cast) {
  FP8TRON_CHECK(l.mode == out.scaling_mode, "quantize_segments: the layout's and the view's scaling modes differ");
  const size_t cols = l.cols;
  for (size_t e = 0; e < l.segments(); ++e) {
    if (l.padded[e] == 0) continue;  // an empty segment has no copies and keeps its scales
    std::vector<uint16_t> padded(l.padded[e] * cols, 0);  // bf16 +0
    const uint16_t* src = x + l.src_begin[e] * cols;
    std::copy(src, src + l.rows[e] * cols, padded.begin());
    const Fp8TensorView v = segment_view(out, l, e);
    switch (cast.kind) {
      case SegmentCast::Kind::kDelayed: quantize_tensor_delayed(padded.data(), v); break;
      case SegmentCast::Kind::kCurrent: quantize_tensor_current(padded.data(), v, cast.current); break;
      case SegmentCast::Kind::kBlockwise: quantize_blockwise(padded.data(), v, cast.block); break;
      case SegmentCast::Kind::kMxfp8: quantize_mxfp8(padded.data(), v); break;
    }
    if (cast.column_sums) {
      float* sums = cast.column_sums + e * cols;
      for (size_t r = 0; r < l.rows[e]; ++r)
        for (size_t c = 0; c < cols; ++c) sums[c] += bf16_to_float(src[r * cols + c]);
    }
  }
}

void dequantize_to_float(const Fp8TensorView& in, bool transposed_copy, float* y) {
  const size_t rows = transposed_copy ? in.cols : in.rows;
  const size_t cols = transposed_copy ? in.rows : in.cols;
  const uint8_t* q = static_cast<const uint8_t*>(transposed_copy ? in.data_t : in.data);
  const void* sinv = transposed_copy ? in.scale_inv_for_t() : in.scale_inv;
  FP8TRON_CHECK(q != nullptr && sinv != nullptr, "dequantize: missing codes or scales");
  const ScaleLayout layout = scale_layout(in.scaling_mode, rows, cols);
  for (size_t r = 0; r < rows; ++r) {
    for (size_t c = 0; c < cols; ++c) {
      const size_t si = scale_index(in.scaling_mode, layout, r, c);
      const float factor = in.scaling_mode == ScalingMode::kMxfp8
                               ? codec::decode_e8m0(static_cast<const uint8_t*>(sinv)[si])
                               : static_cast<const float*>(sinv)[si];
      y[r * cols + c] = decode(in.format, q[r * cols + c]) * factor;
    }
  }
}

void dequantize(const Fp8TensorView& in, bool transposed_copy, uint16_t* y) {
  std::vector<float> f(in.numel());
  dequantize_to_float(in, transposed_copy, f.data());
  for (size_t i = 0; i < f.size(); ++i) y[i] = codec::float_to_bf16(f[i]);
}

}  // namespace fp8tron::fp8::reference
