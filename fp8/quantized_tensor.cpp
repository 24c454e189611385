#include "fp8/quantized_tensor.h"

#include <ATen/cuda/CUDAContext.h>

#include "core/error.h"
#include "core/text.h"
#include "fp8/linear_ops.h"
#include "fp8/quantize_reference.h"
#include "fp8/recipe.h"
#include "fp8/swiglu_backward.h"

namespace fp8tron::fp8 {

namespace {

void* ptr(const torch::Tensor& t) { return t.defined() ? t.data_ptr() : nullptr; }

// Delayed scaling: the slots of `role` of consecutive sites are equally spaced (scaling_state.h:
// forward roles 3 apart, backward roles 2 apart), so segment e's scale is base[e * stride].
size_t slot_stride(const Fp8Engine& e, const std::vector<Fp8Site*>& sites, TensorRole role) {
  const size_t first = e.slot(*sites[0], role);
  const size_t stride = sites.size() > 1 ? e.slot(*sites[1], role) - first : 1;
  for (size_t i = 0; i < sites.size(); ++i)
    FP8TRON_CHECK(e.slot(*sites[i], role) == first + i * stride,
                  "grouped FP8 linear: the expert sites were not registered one after the other (" + sites[i]->name +
                      ")");
  return stride;
}

// Points the view's scales at their storage and says how to cast (per recipe).
SegmentCast prepare_scales(Fp8Engine& e, const std::vector<Fp8Site*>& sites, TensorRole role, bool rowwise,
                           bool transposed, bool record_amax, QuantizedSegments& q) {
  const Recipe& recipe = e.recipe();
  const SegmentLayout& l = q.layout;
  SegmentedFp8View& v = q.view;
  const auto floats = torch::TensorOptions().device(e.device()).dtype(torch::kFloat32);
  const auto segments = int64_t(l.segments());
  SegmentCast cast;
  switch (recipe_kind(recipe)) {
    case RecipeKind::kDelayed: {
      cast.kind = SegmentCast::Kind::kDelayed;
      const size_t stride = slot_stride(e, sites, role), first = e.slot(*sites[0], role);
      q.scale_inv = torch::empty({int64_t(l.scale_elements())}, floats);
      v.scale = e.scale().data_ptr<float>() + first;
      v.scale_stride = stride;
      v.amax = record_amax ? e.history().data_ptr<float>() + first : nullptr;
      v.amax_stride = stride;
      break;
    }
    case RecipeKind::kTensorwise: {
      cast.kind = SegmentCast::Kind::kCurrent;
      const auto& current = std::get<CurrentScaling>(recipe);
      cast.current = CurrentScalingOptions{current.power_2_scales, current.amax_epsilon};
      q.scale_inv = torch::empty({int64_t(l.scale_elements())}, floats);
      q.scale = torch::empty({segments}, floats);
      q.amax = torch::empty({segments}, floats);
      v.scale = q.scale.data_ptr<float>();
      v.amax = q.amax.data_ptr<float>();
      break;
    }
    case RecipeKind::kBlockwise:
    case RecipeKind::kMxfp8: {
      const bool mx = recipe_kind(recipe) == RecipeKind::kMxfp8;
      cast.kind = mx ? SegmentCast::Kind::kMxfp8 : SegmentCast::Kind::kBlockwise;
      if (!mx) {
        const auto& block = std::get<BlockwiseScaling>(recipe);
        cast.block = BlockScalingOptions{block.power_2_scales, block.amax_epsilon};
      }
      const auto grid = floats.dtype(mx ? torch::kUInt8 : torch::kFloat32);
      if (rowwise) q.scale_inv = torch::empty({int64_t(l.scale_elements())}, grid);
      if (transposed) q.scale_inv_t = torch::empty({int64_t(l.scale_t_elements())}, grid);
      break;
    }
  }
  v.scale_inv = ptr(q.scale_inv);
  v.scale_inv_t = ptr(q.scale_inv_t);
  return cast;
}

// --log-fp8-stats-to-tensorboard: each segment's values (xb's rows, unpadded) against its FP8
// codes (the row-wise copy, or the transposed one; the alignment padding left out), under its
// expert's site, as fp8_linear records a per-tensor cast.
void record_segment_stats(Fp8Engine& e, const std::vector<Fp8Site*>& sites, TensorRole role, const torch::Tensor& xb,
                          const std::vector<int64_t>& rows, const QuantizedSegments& q) {
  torch::NoGradGuard no_grad;
  const SegmentLayout& l = q.layout;
  const int64_t cols = int64_t(l.cols);
  int64_t x_begin = 0;
  for (size_t i = 0; i < sites.size(); ++i) {
    const int64_t n = rows[i], begin = int64_t(l.row_begin[i]), padded = int64_t(l.padded[i]);
    if (n > 0) {
      const torch::Tensor codes = q.data.defined()
                                      ? q.data.narrow(0, begin, n)
                                      : q.data_t.narrow(0, begin * cols, cols * padded).view({cols, padded}).narrow(1, 0, n).t();
      e.record_stats(*sites[i], role, q.view.format, xb.narrow(0, x_begin, n), codes);
    }
    x_begin += n;
  }
}

}  // namespace

void dequantize_copies(QuantizedSegments& q, bool cpu, CudaStream stream) {
  const SegmentLayout& l = q.layout;
  const int64_t cols = int64_t(l.cols), total = int64_t(l.total_padded());
  const auto options = q.data.defined() ? q.data.options() : q.data_t.options();
  const auto dtype = cpu ? torch::kFloat32 : torch::kBFloat16;
  auto copy = [&](bool t) {
    const std::vector<int64_t> shape = t ? std::vector<int64_t>{total * cols} : std::vector<int64_t>{total, cols};
    auto out = torch::empty(shape, options.dtype(dtype));
    for (size_t e = 0; e < l.segments(); ++e) {
      if (l.padded[e] == 0) continue;
      const size_t offset = l.row_begin[e] * l.cols;
      if (cpu) {
        reference::dequantize_to_float(q.segment(e), t, out.data_ptr<float>() + offset);
      } else {
        dequantize(q.segment(e), t, static_cast<uint16_t*>(out.data_ptr()) + offset, stream);
      }
    }
    return out;
  };
  if (q.data.defined()) q.dequantized = copy(false);
  if (q.data_t.defined()) q.dequantized_t = copy(true);
}

torch::Tensor QuantizedSegments::dequantized_rows(size_t e) const {
  return dequantized.narrow(0, int64_t(layout.row_begin[e]), int64_t(layout.padded[e]));
}

torch::Tensor QuantizedSegments::dequantized_cols(size_t e) const {
  const int64_t cols = int64_t(layout.cols), padded = int64_t(layout.padded[e]);
  return dequantized_t.narrow(0, int64_t(layout.row_begin[e]) * cols, cols * padded).view({cols, padded});
}

std::shared_ptr<QuantizedSegments> quantize_grouped(Fp8Engine& e, const std::vector<Fp8Site*>& sites, TensorRole role,
                                                    const torch::Tensor& x2d, const std::vector<int64_t>& rows,
                                                    bool rowwise, bool transposed, bool record_amax,
                                                    float* column_sums, Prologue prologue,
                                                    const torch::Tensor& swiglu_input) {
  FP8TRON_CHECK(!sites.empty() && sites.size() == rows.size(), "quantize_grouped: one site per segment");
  FP8TRON_CHECK(rowwise || transposed, "quantize_grouped: neither copy requested");
  FP8TRON_CHECK(prologue == Prologue::kNone || prologue == Prologue::kSwiglu || prologue == Prologue::kSwigluBackward,
                "quantize_grouped: the prologues are SwiGLU and its backward");
  const bool backward = prologue == Prologue::kSwigluBackward;
  FP8TRON_CHECK(!backward || (swiglu_input.defined() && swiglu_input.size(0) == x2d.size(0) &&
                              swiglu_input.size(1) == 2 * x2d.size(1)),
                "quantize_grouped: the SwiGLU backward needs its [gate | up] input, twice as wide as the gradient");
  const bool fused = prologue != Prologue::kNone && transposed && grouped_swiglu_cast_fuses(e, role) &&
                     (!backward || (x2d.size(1) % 128 == 0 && x2d.scalar_type() == torch::kBFloat16 &&
                                    swiglu_input.scalar_type() == torch::kBFloat16));
  if (prologue != Prologue::kNone && !fused) {
    const torch::Tensor values = backward ? e.swiglu_backward(x2d, swiglu_input) : torch_swiglu(x2d);
    return quantize_grouped(e, sites, role, values, rows, rowwise, transposed, record_amax, column_sums);
  }
  const Recipe& recipe = e.recipe();
  const Path path = path_of(e);
  auto q = std::make_shared<QuantizedSegments>();
  const ScalingMode mode = scaling_mode(recipe, role);
  const size_t width = size_t(x2d.size(1));
  const size_t cols = prologue == Prologue::kSwiglu ? width / 2 : backward ? 2 * width : width;
  q->layout = make_segment_layout(mode, cols, rows, fp8_token_alignment(recipe));
  const SegmentLayout& l = q->layout;
  FP8TRON_CHECK(l.total_rows() == size_t(x2d.size(0)), "quantize_grouped: the segments do not cover the rows");
  SegmentedFp8View& v = q->view;
  v.format = tensor_format(recipe, role);
  v.scaling_mode = mode;
  const auto bytes = torch::TensorOptions().device(x2d.device()).dtype(torch::kUInt8);
  const int64_t total = int64_t(l.total_padded());
  if (rowwise) q->data = torch::empty({total, int64_t(cols)}, bytes);
  if (transposed) q->data_t = torch::empty({total * int64_t(cols)}, bytes);
  v.data = ptr(q->data);
  v.data_t = ptr(q->data_t);
  SegmentCast cast = prepare_scales(e, sites, role, rowwise, transposed, record_amax, *q);
  cast.column_sums = column_sums;
  cast.prologue = prologue;
  torch::Tensor aux;
  if (backward) {
    aux = swiglu_input.contiguous();
    cast.aux = static_cast<const uint16_t*>(aux.data_ptr());
  }
  // The quantizers read bf16: on the CPU path an fp32 model's activations are rounded first, as
  // the GPU path's activations are bf16 (fp8_linear does the same).
  const torch::Tensor xb = x2d.to(torch::kBFloat16).contiguous();
  const auto* x = static_cast<const uint16_t*>(xb.data_ptr());
  const bool cpu = path == Path::kCpu;
  const CudaStream stream = cpu ? nullptr : current_stream(x2d.device());
  if (total > 0) cpu ? reference::quantize_segments(x, l, v, cast) : quantize_segments(x, l, v, cast, stream);
  if (e.collecting_stats()) {
    const torch::Tensor values = prologue == Prologue::kSwiglu ? torch_swiglu(xb) : backward ? e.swiglu_backward(xb, aux) : xb;
    record_segment_stats(e, sites, role, values, rows, *q);
  }
  if (path != Path::kNative) dequantize_copies(*q, cpu, stream);
  return q;
}

bool grouped_swiglu_cast_fuses(const Fp8Engine& e, TensorRole role) {
  return path_of(e) == Path::kNative && recipe_kind(e.recipe()) == RecipeKind::kDelayed &&
         scaling_mode(e.recipe(), role) == ScalingMode::kTensor;
}

// ---- per-tensor quantizers ------------------------------------------------------------------------

CudaStream current_stream(const torch::Device& device) {
  return at::cuda::getCurrentCUDAStream(device.index()).stream();
}

Path path_of(const Fp8Engine& e) {
  if (!e.device().is_cuda()) return Path::kCpu;
  return e.emulated() ? Path::kEmulated : Path::kNative;
}


torch::Tensor scale_storage(const ScaleLayout& layout, const torch::Device& device) {
  const auto dtype = layout.element_bytes == 1 ? torch::kUInt8 : torch::kFloat32;
  return torch::empty({int64_t(layout.elements())}, torch::TensorOptions().device(device).dtype(dtype));
}
namespace {

// --log-fp8-stats-to-tensorboard: the values a cast quantized (a fused prologue applied as the
// kernel applies it), against its FP8 codes (`transposed`: the codes are the transposed copy).
void record_cast_stats(Fp8Engine& e, const Fp8Site& site, TensorRole role, Format format, const torch::Tensor& xb,
                       const TensorCastFusion& fusion, const torch::Tensor& codes, bool transposed) {
  torch::NoGradGuard no_grad;
  torch::Tensor values = xb;
  const auto floats = torch::TensorOptions().device(xb.device()).dtype(torch::kFloat32);
  switch (fusion.prologue) {
    case Prologue::kNone: break;
    case Prologue::kGeluTanh: values = at::gelu(xb, "tanh"); break;
    case Prologue::kSwiglu: values = torch_swiglu(xb); break;
    case Prologue::kGeluTanhBackward: {
      auto aux = torch::from_blob(const_cast<uint16_t*>(fusion.aux), xb.sizes(), floats.dtype(torch::kBFloat16));
      values = at::gelu_backward(xb, aux, "tanh");
      break;
    }
    case Prologue::kSwigluBackward: {
      auto h = torch::from_blob(const_cast<uint16_t*>(fusion.aux), {xb.size(0), 2 * xb.size(1)},
                                floats.dtype(torch::kBFloat16));
      values = e.swiglu_backward(xb, h);
      break;
    }
    case Prologue::kLayerNorm: {
      const int64_t rows = xb.size(0), cols = xb.size(1);
      auto rstd = torch::from_blob(const_cast<float*>(fusion.norm.rstd), {rows, 1}, floats);
      auto x = xb.to(torch::kFloat32);
      if (fusion.norm.mean) x = x - torch::from_blob(const_cast<float*>(fusion.norm.mean), {rows, 1}, floats);
      x = x * rstd * torch::from_blob(const_cast<uint16_t*>(fusion.norm.gamma), {cols}, floats.dtype(torch::kBFloat16));
      if (fusion.norm.beta)
        x = x + torch::from_blob(const_cast<uint16_t*>(fusion.norm.beta), {cols}, floats.dtype(torch::kBFloat16));
      values = x;
      break;
    }
  }
  e.record_stats(site, role, format, values, transposed ? codes.t() : codes);
}

}  // namespace

std::shared_ptr<Quantized> quantize(Fp8Engine& e, const Fp8Site& site, TensorRole role, torch::Tensor x2d,
                                    bool rowwise, bool transposed, bool record_amax, TensorCastFusion fusion,
                                    const AmaxReducer* reduce_current, bool count_stats) {
  const Recipe& recipe = e.recipe();
  const Path path = path_of(e);
  // The fused kernels serve per-tensor scaling on the GPU; elsewhere the prologue runs first.
  const bool fusable = path != Path::kCpu && scaling_mode(recipe, role) == ScalingMode::kTensor && transposed;
  if (fusion.prologue == Prologue::kGeluTanh && !fusable) x2d = at::gelu(x2d, "tanh");
  if (fusion.prologue == Prologue::kSwiglu && !(fusable && recipe_kind(recipe) == RecipeKind::kDelayed)) {
    x2d = torch_swiglu(x2d);
    fusion.prologue = Prologue::kNone;
  }
  FP8TRON_CHECK(fusion.column_sums == nullptr || fusable, "column sums need the fused per-tensor GPU cast");
  FP8TRON_CHECK(fusion.prologue != Prologue::kGeluTanhBackward || fusable, "the GeLU-backward cast needs the fused path");
  FP8TRON_CHECK(fusion.prologue != Prologue::kLayerNorm || (fusable && recipe_kind(recipe) == RecipeKind::kDelayed),
                "the LayerNorm cast needs the fused delayed-scaling path");
  FP8TRON_CHECK(fusion.prologue != Prologue::kSwigluBackward || (fusable && recipe_kind(recipe) == RecipeKind::kDelayed),
                "the SwiGLU-backward cast needs the fused delayed-scaling path");
  if (!fusable) fusion.prologue = Prologue::kNone;
  auto q = std::make_shared<Quantized>();
  Fp8TensorView& v = q->view;
  v.format = tensor_format(recipe, role);
  v.scaling_mode = scaling_mode(recipe, role);
  v.rows = size_t(x2d.size(0));
  // SwiGLU halves the width; its backward doubles it.
  v.cols = fusion.prologue == Prologue::kSwiglu           ? size_t(x2d.size(1) / 2)
           : fusion.prologue == Prologue::kSwigluBackward ? size_t(2 * x2d.size(1))
                                                          : size_t(x2d.size(1));
  const auto device = x2d.device();
  const auto bytes = torch::TensorOptions().device(device).dtype(torch::kUInt8);
  const auto floats = bytes.dtype(torch::kFloat32);
  const int64_t rows = int64_t(v.rows), cols = int64_t(v.cols);
  if (rowwise) q->data = torch::empty({rows, cols}, bytes);
  if (transposed) q->data_t = torch::empty({cols, rows}, bytes);
  v.data = ptr(q->data);
  v.data_t = ptr(q->data_t);
  // The quantizers read bf16: on the CPU path an fp32 model's activations are rounded to bf16
  // first, as the GPU path's bf16 activations are.
  const torch::Tensor xb = x2d.to(torch::kBFloat16).contiguous();
  const auto* x = static_cast<const uint16_t*>(xb.data_ptr());
  const bool cpu = path == Path::kCpu;
  CudaStream stream = cpu ? nullptr : current_stream(device);

  switch (v.scaling_mode) {
    case ScalingMode::kTensor: {
      q->scale_inv = torch::empty({1}, floats);
      v.scale_inv = ptr(q->scale_inv);
      if (recipe_kind(recipe) == RecipeKind::kDelayed) {
        const size_t s = e.slot(site, role);
        v.scale = e.scale().data_ptr<float>() + s;
        v.amax = record_amax ? e.history().data_ptr<float>() + s : nullptr;
        cpu ? reference::quantize_tensor_delayed(x, v) : quantize_tensor_delayed(x, v, stream, fusion);
      } else {
        const auto& current = std::get<CurrentScaling>(recipe);
        const CurrentScalingOptions options{current.power_2_scales, current.amax_epsilon};
        q->scale = torch::empty({1}, floats);
        q->amax = torch::empty({1}, floats);
        v.scale = q->scale.data_ptr<float>();
        v.amax = q->amax.data_ptr<float>();
        if (reduce_current) {
          FP8TRON_CHECK(fusion.prologue == Prologue::kNone && fusion.column_sums == nullptr,
                        "a reduced current-scaling amax takes no fused prologue");
          if (cpu) {
            q->amax.fill_(reference::amax_bf16(x, v.numel()));
          } else {
            q->amax.zero_();
            amax_bf16(x, v.numel(), v.amax, stream);
          }
          (*reduce_current)(q->amax);
          cpu ? reference::quantize_tensor_current_given_amax(x, v, options)
              : quantize_tensor_current_given_amax(x, v, options, stream);
        } else {
          cpu ? reference::quantize_tensor_current(x, v, options) : quantize_tensor_current(x, v, options, stream, fusion);
        }
      }
      break;
    }
    case ScalingMode::kBlock1x128:
    case ScalingMode::kBlock128x128: {
      const auto& block = std::get<BlockwiseScaling>(recipe);
      const BlockScalingOptions options{block.power_2_scales, block.amax_epsilon};
      if (rowwise) q->scale_inv = scale_storage(v.layout(), device);
      if (transposed) q->scale_inv_t = scale_storage(v.layout_t(), device);
      v.scale_inv = ptr(q->scale_inv);
      v.scale_inv_t = ptr(q->scale_inv_t);
      cpu ? reference::quantize_blockwise(x, v, options) : quantize_blockwise(x, v, options, stream);
      break;
    }
    case ScalingMode::kMxfp8: {
      if (rowwise) q->scale_inv = scale_storage(v.layout(), device);
      if (transposed) q->scale_inv_t = scale_storage(v.layout_t(), device);
      v.scale_inv = ptr(q->scale_inv);
      v.scale_inv_t = ptr(q->scale_inv_t);
      cpu ? reference::quantize_mxfp8(x, v) : quantize_mxfp8(x, v, stream);
      break;
    }
  }
  if (count_stats && e.collecting_stats())
    record_cast_stats(e, site, role, v.format, xb, fusion, q->data.defined() ? q->data : q->data_t, !q->data.defined());
  if (path == Path::kNative) return q;
  // Emulation: the GEMMs run in high precision on the dequantized values (bf16 on the GPU as the
  // tensor cores would see them after the scale; fp32 on the CPU).
  auto dequantize_copy = [&](bool t) {
    const int64_t r = t ? cols : rows, c = t ? rows : cols;
    if (cpu) {
      auto out = torch::empty({r, c}, torch::kFloat32);
      reference::dequantize_to_float(v, t, out.data_ptr<float>());
      return out;
    }
    auto out = torch::empty({r, c}, torch::TensorOptions().device(device).dtype(torch::kBFloat16));
    dequantize(v, t, static_cast<uint16_t*>(out.data_ptr()), stream);
    return out;
  };
  if (rowwise) q->dequantized = dequantize_copy(false);
  if (transposed) q->dequantized_t = dequantize_copy(true);
  return q;
}

bool weight_from_gathered_codes(const Fp8Site& site) {
  return site.codes.defined() && site.codes_generation == site.engine->weight_generation();
}

std::shared_ptr<Quantized> quantized_weight(Fp8Site& site, const torch::Tensor& weight, bool record_amax) {
  Fp8Engine& e = *site.engine;
  if (weight_from_gathered_codes(site)) {
    // --fp8-param-gather: the gathered codes are this step's weight (its amax was recorded when
    // the optimizer cast it).
    if (!(site.weight && site.weight_generation == e.weight_generation() && site.weight_data == site.codes.data_ptr())) {
      site.weight = weight_from_codes(e, site);
      site.weight_generation = e.weight_generation();
      site.weight_data = site.codes.data_ptr();
      site.weight_version = -1;
    }
    return site.weight;
  }
  const bool fresh = site.weight && site.weight_generation == e.weight_generation() &&
                     site.weight_data == weight.data_ptr() && site.weight_version == int64_t(weight._version());
  if (fresh) return site.weight;
  // Evaluation quantizes without recording amaxes and without caching, so the next training
  // step still records its weight amax.
  if (!record_amax) return quantize(e, site, TensorRole::kWeight, weight.detach(), true, true, false);
  site.weight = quantize(e, site, TensorRole::kWeight, weight.detach(), true, true, true);
  site.weight_generation = e.weight_generation();
  site.weight_data = weight.data_ptr();
  site.weight_version = int64_t(weight._version());
  return site.weight;
}

}  // namespace fp8tron::fp8
