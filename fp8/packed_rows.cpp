#include "fp8/packed_rows.h"

#include <cstdint>

#include "core/error.h"
#include "core/text.h"
#include "fp8/quantize_reference.h"
#include "fp8/recipe.h"
#include "fp8/scale_math.h"

namespace fp8tron::fp8 {
namespace {

void* data_or_null(const torch::Tensor& t) { return t.defined() ? t.data_ptr() : nullptr; }

// A copy of t with row-major strides and offset 0 (contiguous() keeps the stride of a dimension of
// size 1, which a view as another element size refuses).
torch::Tensor dense(const torch::Tensor& t) { return torch::empty(t.sizes(), t.options()).copy_(t); }

// A small host table on `device`, queued without draining the stream (pinned memory, as the
// permutation's tables: a copy from pageable memory would wait for the GPU's queue).
torch::Tensor table_on(const torch::Device& device, const std::vector<int64_t>& values) {
  auto host = torch::tensor(values, torch::kInt64);
  if (!device.is_cuda()) return host;
  return host.pin_memory().to(device, /*non_blocking=*/true);
}

SegmentCast cast_of(const Recipe& recipe) {
  SegmentCast cast;
  if (recipe_kind(recipe) == RecipeKind::kMxfp8) {
    cast.kind = SegmentCast::Kind::kMxfp8;
  } else {
    cast.kind = SegmentCast::Kind::kBlockwise;
    const auto& block = std::get<BlockwiseScaling>(recipe);
    cast.block = BlockScalingOptions{block.power_2_scales, block.amax_epsilon};
  }
  return cast;
}

// Row-wise scale grids start every segment at scale_begin; within segment e a row's scales are
// `stride` apart: 1x128 grids are M-major (a column block's scales of all padded_e rows are
// contiguous), MXFP8 grids row-major.
struct RowScales {
  size_t first, stride;
};
RowScales row_scales(const SegmentLayout& l, size_t e, size_t row_in_segment) {
  if (l.mode == ScalingMode::kMxfp8) {
    const size_t per_row = scale_layout(l.mode, l.padded[e], l.cols).ld;
    return {l.scale_begin[e] + row_in_segment * per_row, 1};
  }
  return {l.scale_begin[e] + row_in_segment, scale_layout(l.mode, l.padded[e], l.cols).ld};
}

// The row-wise copy of `packed` (rows grouped by segment, rows[e] each) in quantize_grouped's
// layout: codes at their padded rows, zero codes in the padding, every scale at its grid position,
// the padding's scales those of an all-zero block (blockwise 1, MXFP8 encode_e8m0(0)).
std::shared_ptr<QuantizedSegments> rowwise_from_packed(const Recipe& recipe, const torch::Tensor& packed,
                                                       const PackedRowLayout& p, const std::vector<int64_t>& rows) {
  auto q = std::make_shared<QuantizedSegments>();
  q->layout = make_segment_layout(p.mode, size_t(p.cols), rows, fp8_token_alignment(recipe));
  const SegmentLayout& l = q->layout;
  FP8TRON_CHECK(packed.dim() == 2 && packed.scalar_type() == torch::kUInt8 && packed.size(1) == p.row_bytes(),
                strprintf("packed FP8 rows: expected uint8 rows of %lld bytes", (long long)p.row_bytes()));
  FP8TRON_CHECK(size_t(packed.size(0)) == l.total_rows(), "packed FP8 rows: the segments do not cover the rows");
  const auto bytes = torch::TensorOptions().device(packed.device()).dtype(torch::kUInt8);
  const bool mx = p.mode == ScalingMode::kMxfp8;
  q->data = torch::zeros({int64_t(l.total_padded()), p.cols}, bytes);
  const auto grid = int64_t(l.scale_elements());
  q->scale_inv = mx ? torch::full({grid}, int64_t(codec::encode_e8m0(0.0f)), bytes)
                    : torch::ones({grid}, bytes.dtype(torch::kFloat32));
  const int64_t n = packed.size(0);
  if (n > 0) {
    std::vector<int64_t> dst(static_cast<size_t>(n)), first(static_cast<size_t>(n)), stride(static_cast<size_t>(n));
    for (size_t e = 0; e < l.segments(); ++e)
      for (size_t i = 0; i < l.rows[e]; ++i) {
        const size_t src = l.src_begin[e] + i;
        const RowScales s = row_scales(l, e, i);
        dst[src] = int64_t(l.row_begin[e] + i);
        first[src] = int64_t(s.first);
        stride[src] = int64_t(s.stride);
      }
    const auto device = packed.device();
    q->data.index_copy_(0, table_on(device, dst), packed.narrow(1, 0, p.cols));
    auto scale_bytes = dense(packed.narrow(1, p.cols, p.scales * p.scale_bytes));
    const auto scales = mx ? scale_bytes : scale_bytes.view(torch::kFloat32);  // [n, scales]
    const auto at = table_on(device, first).unsqueeze(1) +
                    torch::arange(p.scales, bytes.dtype(torch::kInt64)).unsqueeze(0) * table_on(device, stride).unsqueeze(1);
    q->scale_inv.index_copy_(0, at.reshape({-1}), scales.reshape({-1}));
  }
  SegmentedFp8View& v = q->view;
  v.format = p.format;
  v.scaling_mode = p.mode;
  v.data = data_or_null(q->data);
  v.scale_inv = data_or_null(q->scale_inv);
  return q;
}

}  // namespace

bool quantizes_rows_alone(const Recipe& recipe) {
  const RecipeKind kind = recipe_kind(recipe);
  return kind == RecipeKind::kBlockwise || kind == RecipeKind::kMxfp8;
}

PackedRowLayout packed_row_layout(const Recipe& recipe, int64_t cols) {
  if (!quantizes_rows_alone(recipe))
    throw UserError(strprintf("FP8 rows quantized before they travel need a per-block recipe (blockwise or mxfp8), not %s",
                              recipe_kind_name(recipe_kind(recipe))));
  PackedRowLayout p;
  p.mode = scaling_mode(recipe, TensorRole::kInput);
  p.format = tensor_format(recipe, TensorRole::kInput);
  p.cols = cols;
  const bool mx = p.mode == ScalingMode::kMxfp8;
  p.scales = int64_t(ceil_div(size_t(cols), mx ? kMxBlock : kBlockLen));
  p.scale_bytes = mx ? 1 : 4;
  return p;
}

torch::Tensor quantize_packed_rows(Fp8Engine& e, const torch::Tensor& x2d) {
  FP8TRON_CHECK(x2d.dim() == 2, "quantize_packed_rows: the input must be [rows, cols]");
  const Recipe& recipe = e.recipe();
  const PackedRowLayout p = packed_row_layout(recipe, x2d.size(1));
  const int64_t n = x2d.size(0);
  const auto bytes = torch::TensorOptions().device(x2d.device()).dtype(torch::kUInt8);
  if (n == 0) return torch::empty({0, p.row_bytes()}, bytes);
  // One segment: the grouped cast pads it to the recipe's alignment with zero rows (which change
  // no block of a real row) and writes its scales in the GEMM-ready grid.
  const SegmentLayout l = make_segment_layout(p.mode, size_t(p.cols), {n}, fp8_token_alignment(recipe));
  const bool mx = p.mode == ScalingMode::kMxfp8;
  auto data = torch::empty({int64_t(l.total_padded()), p.cols}, bytes);
  auto grid = torch::empty({int64_t(l.scale_elements())}, mx ? bytes : bytes.dtype(torch::kFloat32));
  SegmentedFp8View v;
  v.data = data.data_ptr();
  v.scale_inv = grid.data_ptr();
  v.format = p.format;
  v.scaling_mode = p.mode;
  torch::Tensor xb = x2d.detach().to(torch::kBFloat16).contiguous();
  if (reinterpret_cast<uintptr_t>(xb.data_ptr()) % 16 != 0) xb = xb.clone();  // the kernel's 16-byte loads
  const auto* x = static_cast<const uint16_t*>(xb.data_ptr());
  if (x2d.is_cuda()) {
    quantize_segments(x, l, v, cast_of(recipe), current_stream(x2d.device()));
  } else {
    reference::quantize_segments(x, l, v, cast_of(recipe));
  }
  const ScaleLayout g = scale_layout(p.mode, l.padded[0], size_t(p.cols));
  // Each row's scales in row order: MXFP8's grid is row-major already, 1x128's is M-major.
  torch::Tensor scales = mx ? grid.view({int64_t(g.outer), int64_t(g.ld)}).narrow(0, 0, n).narrow(1, 0, p.scales)
                            : grid.view({int64_t(g.outer), int64_t(g.ld)}).narrow(1, 0, n).t();
  scales = dense(scales);
  if (!mx) scales = scales.view(torch::kUInt8);  // [n, 4 scales]: each fp32 as its bytes
  return torch::cat({data.narrow(0, 0, n), scales}, 1);
}

torch::Tensor dequantize_packed_rows(Fp8Engine& e, const torch::Tensor& packed, int64_t cols) {
  const PackedRowLayout p = packed_row_layout(e.recipe(), cols);
  const int64_t n = packed.size(0);
  const bool cpu = !packed.is_cuda();
  const auto dtype = cpu ? torch::kFloat32 : torch::kBFloat16;
  if (n == 0) return torch::empty({0, cols}, packed.options().dtype(dtype));
  // Dequantization is row-local: the rows as one segment give each row's values.
  auto q = rowwise_from_packed(e.recipe(), packed, p, {n});
  dequantize_copies(*q, cpu, cpu ? nullptr : current_stream(packed.device()));
  return q->dequantized.narrow(0, 0, n);
}

std::shared_ptr<QuantizedSegments> quantize_grouped_from_packed(Fp8Engine& e, const std::vector<Fp8Site*>& sites,
                                                                const torch::Tensor& packed, const torch::Tensor& values,
                                                                const std::vector<int64_t>& rows, bool transposed) {
  FP8TRON_CHECK(!sites.empty() && sites.size() == rows.size(), "quantize_grouped_from_packed: one site per segment");
  FP8TRON_CHECK(values.dim() == 2 && values.size(0) == packed.size(0),
                "quantize_grouped_from_packed: the values must be the packed rows' [rows, cols]");
  const PackedRowLayout p = packed_row_layout(e.recipe(), values.size(1));
  auto q = rowwise_from_packed(e.recipe(), packed, p, rows);
  const Path path = path_of(e);
  const bool cpu = path == Path::kCpu;
  if (path != Path::kNative) dequantize_copies(*q, cpu, cpu ? nullptr : current_stream(packed.device()));
  if (transposed) {
    // The wgrad operand: blocks along the tokens, which came from several ranks; quantized here
    // from the values the codes stand for.
    auto t = quantize_grouped(e, sites, TensorRole::kInput, values, rows, /*rowwise=*/false, /*transposed=*/true,
                              /*record_amax=*/false);
    q->data_t = t->data_t;
    q->scale_inv_t = t->scale_inv_t;
    q->dequantized_t = t->dequantized_t;
    q->view.data_t = data_or_null(q->data_t);
    q->view.scale_inv_t = data_or_null(q->scale_inv_t);
  }
  return q;
}

}  // namespace fp8tron::fp8
