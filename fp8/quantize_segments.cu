// Grouped tensors (the experts of a grouped linear, segments.h): every segment cast in one launch
// per 64 segments, for every recipe, through the shared tile kernel.
#include <vector>

#include "fp8/quantize_tile.cuh"

namespace fp8tron::fp8 {
using namespace cast;

namespace {

// Up to kMaxSegments segments of a grouped tensor (segments.h), passed by value (about 2.3 KiB,
// within the 4 KiB of kernel parameters); more segments take several launches. Rows and scale
// offsets are the whole tensor's; tiles are counted from the launch's first segment, whose index
// in the whole tensor is `first`.
constexpr int kMaxSegments = 64;
struct SegmentTable {
  int count = 0;
  uint32_t first = 0;
  uint32_t tile_begin[kMaxSegments + 1];  // 128-row tiles of the padded rows, prefix sums
  uint32_t src_row[kMaxSegments];         // first row of x
  uint32_t x_rows[kMaxSegments];          // rows of x (the rest of the padded rows are zeros)
  uint32_t dst_row[kMaxSegments];         // first padded row (data; data_t at dst_row * cols)
  uint32_t rows[kMaxSegments];            // padded rows
  uint32_t scale_begin[kMaxSegments], scale_t_begin[kMaxSegments];  // block scale grids (elements)
  uint32_t ld[kMaxSegments], ld_t[kMaxSegments];                    // their leading dimensions
  uint32_t scale_stride = 1, amax_stride = 1;                       // tensor scales (segments.h)
};

// The segment holding tile row `tile`: the last one whose tiles start at or before it (empty
// segments own no tiles and are passed over).
__device__ __forceinline__ int segment_of_tile(const SegmentTable& t, uint32_t tile) {
  int lo = 0, hi = t.count - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (t.tile_begin[mid] <= tile) lo = mid; else hi = mid - 1;
  }
  return lo;
}

// Segment s's tile arguments from the whole tensor's (`base`: pointers to segment 0's data and
// scales, tensor scale pointers to segment 0's).
template <TileMode M>
__device__ __forceinline__ TileArgs segment_tile_args(const TileArgs& base, const SegmentTable& t, int s) {
  TileArgs a = base;
  const size_t e = t.first + static_cast<size_t>(s);
  // x's rows: kSwiglu reads [gate | up] rows twice as long as the output's, kSwigluBackward the
  // output gradient's, half as long (its [gate | up] rows are aux's).
  const Prologue p = base.tensor.prologue;
  const size_t x_ld = p == Prologue::kSwiglu ? 2 * base.cols : p == Prologue::kSwigluBackward ? base.cols / 2 : base.cols;
  a.x = base.x + static_cast<size_t>(t.src_row[s]) * x_ld;
  if (p == Prologue::kSwigluBackward) a.tensor.aux = base.tensor.aux + static_cast<size_t>(t.src_row[s]) * base.cols;
  a.x_rows = t.x_rows[s];
  a.rows = t.rows[s];
  const size_t codes = static_cast<size_t>(t.dst_row[s]) * base.cols;
  a.out = base.out ? base.out + codes : nullptr;
  a.out_t = base.out_t ? base.out_t + codes : nullptr;
  TensorScaleArgs& ts = a.tensor;
  if (ts.scale_in) ts.scale_in += e * t.scale_stride;
  if (ts.scale_out) ts.scale_out += e * t.scale_stride;
  if (ts.amax_in) ts.amax_in += e;
  if (ts.amax_out) ts.amax_out += e * t.amax_stride;
  if (ts.scale_inv_out) ts.scale_inv_out += t.scale_begin[s];
  if (ts.column_sums) ts.column_sums += e * base.cols;
  constexpr size_t kScaleBytes = M == TileMode::kMx ? 1 : 4;
  if (a.scale_inv) a.scale_inv = static_cast<uint8_t*>(a.scale_inv) + t.scale_begin[s] * kScaleBytes;
  if (a.scale_inv_t) a.scale_inv_t = static_cast<uint8_t*>(a.scale_inv_t) + t.scale_t_begin[s] * kScaleBytes;
  a.ld = t.ld[s];
  a.ld_t = t.ld_t[s];
  return a;
}

static_assert(sizeof(TileArgs) + sizeof(SegmentTable) <= 4096, "the grouped cast's kernel parameters exceed 4 KiB");

// Grid: (column tiles, the launch's 128-row tiles over all its segments); kSwigluBwd: column tile
// pairs (the gate half's tiles), as the dense cast.
template <Format F, TileMode M, bool kSwigluBwd = false>
__global__ void __launch_bounds__(kThreads) quantize_segments_kernel(const TileArgs base, const SegmentTable t) {
  const int s = segment_of_tile(t, blockIdx.y);
  const uint32_t tile = blockIdx.y - t.tile_begin[s];
  const TileArgs a = segment_tile_args<M>(base, t, s);
  quantize_tile<F, M, kSwigluBwd>(a, static_cast<size_t>(tile) * kTile, static_cast<size_t>(blockIdx.x) * kTile,
                                  tile == 0 && blockIdx.x == 0);
}

// Current scaling's first pass: amax[first + s] = max |x| over segment s, one 128x128 tile per
// block (amaxes zeroed by the caller).
__global__ void __launch_bounds__(kThreads)
    segment_amax_kernel(const uint16_t* x, size_t cols, const SegmentTable t, float* amax) {
  __shared__ float red[kWarps + 1];
  const int s = segment_of_tile(t, blockIdx.y);
  const size_t r0 = static_cast<size_t>(blockIdx.y - t.tile_begin[s]) * kTile;
  const int tx = threadIdx.x & 15, ty = threadIdx.x >> 4;
  const size_t col = static_cast<size_t>(blockIdx.x) * kTile + 8 * tx;
  const uint16_t* xs = x + static_cast<size_t>(t.src_row[s]) * cols;
  float m = 0.0f;
  if (col < cols) {
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const size_t row = r0 + 8 * ty + i;
      if (row < t.x_rows[s]) m = abs_max8(__ldg(reinterpret_cast<const uint4*>(xs + row * cols + col)), m);
    }
  }
  m = block_max(m, red);
  if (threadIdx.x == 0) atomic_max_amax(amax + t.first + s, m);
}

// The launches of a grouped tensor: kMaxSegments segments each.
std::vector<SegmentTable> segment_tables(const SegmentLayout& l, size_t amax_stride, size_t scale_stride) {
  FP8TRON_CHECK(l.total_padded() < (size_t{1} << 32) && l.scale_elements() < (size_t{1} << 32) &&
                    l.scale_t_elements() < (size_t{1} << 32),
                "grouped tensor too large for 32-bit segment offsets");
  std::vector<SegmentTable> tables;
  for (size_t f = 0; f < l.segments(); f += kMaxSegments) {
    SegmentTable t;
    t.count = static_cast<int>(std::min<size_t>(kMaxSegments, l.segments() - f));
    t.first = static_cast<uint32_t>(f);
    t.scale_stride = static_cast<uint32_t>(scale_stride);
    t.amax_stride = static_cast<uint32_t>(amax_stride);
    for (int i = 0; i <= t.count; ++i) t.tile_begin[i] = static_cast<uint32_t>(l.tile_begin[f + i] - l.tile_begin[f]);
    for (int i = 0; i < t.count; ++i) {
      const size_t e = f + static_cast<size_t>(i);
      t.src_row[i] = static_cast<uint32_t>(l.src_begin[e]);
      t.x_rows[i] = static_cast<uint32_t>(l.rows[e]);
      t.dst_row[i] = static_cast<uint32_t>(l.row_begin[e]);
      t.rows[i] = static_cast<uint32_t>(l.padded[e]);
      t.scale_begin[i] = static_cast<uint32_t>(l.scale_begin[e]);
      t.scale_t_begin[i] = static_cast<uint32_t>(l.scale_t_begin[e]);
      t.ld[i] = static_cast<uint32_t>(scale_layout(l.mode, l.padded[e], l.cols).ld);
      t.ld_t[i] = static_cast<uint32_t>(scale_layout(l.mode, l.cols, l.padded[e]).ld);
    }
    FP8TRON_CHECK(t.tile_begin[t.count] <= 65535u, "too many rows in one grouped launch for the tile grid");
    tables.push_back(t);
  }
  return tables;
}

dim3 segment_grid(size_t cols, const SegmentTable& t) {
  return dim3(static_cast<unsigned>(ceil_div(cols, kTile)), t.tile_begin[t.count]);
}

template <TileMode M, Format F>
void launch_segments(const TileArgs& base, const std::vector<SegmentTable>& tables, CudaStream stream) {
  for (const SegmentTable& t : tables) {
    if (t.tile_begin[t.count] == 0) continue;  // only empty segments
    if constexpr (M == TileMode::kTensorGiven) {
      if (base.tensor.prologue == Prologue::kSwigluBackward) {
        const dim3 pairs(static_cast<unsigned>(base.cols / 2 / kTile), t.tile_begin[t.count]);
        quantize_segments_kernel<F, M, true><<<pairs, kThreads, 0, stream>>>(base, t);
        FP8TRON_CUDA_CHECK_LAUNCH("quantize_segments_kernel (SwiGLU backward)");
        continue;
      }
    }
    quantize_segments_kernel<F, M><<<segment_grid(base.cols, t), kThreads, 0, stream>>>(base, t);
    FP8TRON_CUDA_CHECK_LAUNCH("quantize_segments_kernel");
  }
}

template <TileMode M>
void dispatch_segments(Format f, const TileArgs& base, const std::vector<SegmentTable>& tables, CudaStream stream) {
  constexpr bool kTensorMode = M == TileMode::kTensorGiven || M == TileMode::kTensorFromAmax;
  switch (f) {
    case Format::kE4M3: launch_segments<M, Format::kE4M3>(base, tables, stream); return;
    case Format::kE5M2: launch_segments<M, Format::kE5M2>(base, tables, stream); return;
    case Format::kHiF8:
      if constexpr (kTensorMode) {
        launch_segments<M, Format::kHiF8>(base, tables, stream);
        return;
      }
      break;
    default: break;
  }
  FP8TRON_CHECK(false, std::string("no grouped quantizer for format ") + format_name(f));
}

void check_segments(const uint16_t* x, const SegmentLayout& l, const SegmentedFp8View& out, const SegmentCast& cast) {
  FP8TRON_CHECK(out.data != nullptr || out.data_t != nullptr, "quantize_segments: neither data nor data_t given");
  FP8TRON_CHECK(l.cols % 16 == 0, strprintf("quantize_segments: %zu columns, not a multiple of 16", l.cols));
  for (size_t e = 0; e < l.segments(); ++e)
    FP8TRON_CHECK(l.padded[e] % 16 == 0, "quantize_segments: padded segment rows must be multiples of 16");
  FP8TRON_CHECK(aligned16(x) && aligned16(out.data) && aligned16(out.data_t),
                "quantize_segments: pointers must be 16-byte aligned");
  FP8TRON_CHECK(l.mode == out.scaling_mode, "quantize_segments: the layout's and the view's scaling modes differ");
  using Kind = SegmentCast::Kind;
  const bool tensor = out.scaling_mode == ScalingMode::kTensor;
  const bool block = out.scaling_mode == ScalingMode::kBlock1x128 || out.scaling_mode == ScalingMode::kBlock128x128;
  FP8TRON_CHECK((cast.kind == Kind::kDelayed || cast.kind == Kind::kCurrent) == tensor &&
                    (cast.kind == Kind::kBlockwise) == block &&
                    (cast.kind == Kind::kMxfp8) == (out.scaling_mode == ScalingMode::kMxfp8),
                "quantize_segments: the cast kind does not match the scaling mode");
  FP8TRON_CHECK(cast.column_sums == nullptr || tensor, "quantize_segments: column sums need a per-tensor cast");
  const bool swiglu = cast.prologue == Prologue::kSwiglu || cast.prologue == Prologue::kSwigluBackward;
  FP8TRON_CHECK(cast.prologue == Prologue::kNone || (swiglu && cast.kind == Kind::kDelayed && out.data_t != nullptr),
                "quantize_segments: the prologues are SwiGLU and its backward, with delayed scaling and the transposed "
                "copies");
  FP8TRON_CHECK(cast.prologue != Prologue::kSwigluBackward ||
                    (l.cols % 256 == 0 && cast.aux != nullptr && aligned16(cast.aux)),
                "quantize_segments: the SwiGLU-backward cast needs cols % 256 == 0 and an aligned [gate | up] operand");
  FP8TRON_CHECK(tensor || ((out.data == nullptr || out.scale_inv != nullptr) &&
                           (out.data_t == nullptr || out.scale_inv_t != nullptr)),
                "quantize_segments: block-scaled copies need their scale_inv");
}

}  // namespace

void quantize_segments(const uint16_t* x, const SegmentLayout& l, const SegmentedFp8View& out, const SegmentCast& cast,
                       CudaStream stream) {
  check_element_format(out.format, out.scaling_mode == ScalingMode::kTensor);
  if (l.total_padded() == 0) return;  // no rows: no buffers either (a zero-size allocation is null)
  check_segments(x, l, out, cast);
  const std::vector<SegmentTable> tables = segment_tables(l, out.amax_stride, out.scale_stride);
  TileArgs base;
  base.x = x;
  base.cols = l.cols;
  base.out = static_cast<uint8_t*>(out.data);
  base.out_t = static_cast<uint8_t*>(out.data_t);
  base.tensor.column_sums = cast.column_sums;
  base.tensor.prologue = cast.prologue;
  base.tensor.aux = cast.aux;
  switch (cast.kind) {
    case SegmentCast::Kind::kDelayed:
      FP8TRON_CHECK(out.scale != nullptr && out.scale_inv != nullptr, "delayed scaling needs scale and scale_inv");
      base.tensor.scale_in = out.scale;
      base.tensor.scale_inv_out = static_cast<float*>(out.scale_inv);
      base.tensor.amax_out = out.amax;
      dispatch_segments<TileMode::kTensorGiven>(out.format, base, tables, stream);
      return;
    case SegmentCast::Kind::kCurrent: {
      FP8TRON_CHECK(out.amax != nullptr && out.amax_stride == 1 && out.scale_inv != nullptr,
                    "current scaling needs contiguous amaxes and scale_inv");
      FP8TRON_CUDA_CHECK(cudaMemsetAsync(out.amax, 0, l.segments() * sizeof(float), stream));
      for (const SegmentTable& t : tables) {
        if (t.tile_begin[t.count] == 0) continue;
        segment_amax_kernel<<<segment_grid(l.cols, t), kThreads, 0, stream>>>(x, l.cols, t, out.amax);
        FP8TRON_CUDA_CHECK_LAUNCH("segment_amax_kernel");
      }
      base.tensor.amax_in = out.amax;
      base.tensor.fp8_max = max_finite(out.format);
      base.tensor.power_2 = cast.current.power_2_scales;
      base.tensor.epsilon = cast.current.amax_epsilon;
      base.tensor.scale_out = out.scale;
      base.tensor.scale_inv_out = static_cast<float*>(out.scale_inv);
      dispatch_segments<TileMode::kTensorFromAmax>(out.format, base, tables, stream);
      return;
    }
    case SegmentCast::Kind::kBlockwise:
      base.scale_inv = out.scale_inv;
      base.scale_inv_t = out.scale_inv_t;
      base.fp8_max = max_finite(out.format);
      base.power_2 = cast.block.power_2_scales;
      base.epsilon = cast.block.amax_epsilon;
      if (out.scaling_mode == ScalingMode::kBlock1x128) {
        dispatch_segments<TileMode::kBlock1x128>(out.format, base, tables, stream);
      } else {
        dispatch_segments<TileMode::kBlock128x128>(out.format, base, tables, stream);
      }
      return;
    case SegmentCast::Kind::kMxfp8:
      base.scale_inv = out.scale_inv;
      base.scale_inv_t = out.scale_inv_t;
      base.fp8_max_rcp = 1.0f / max_finite(out.format);
      dispatch_segments<TileMode::kMx>(out.format, base, tables, stream);
      return;
  }
}

}  // namespace fp8tron::fp8
