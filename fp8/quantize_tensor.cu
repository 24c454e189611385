// Per-tensor casts (delayed and current scaling): the amax pass, the flat cast without a
// transposed copy (16 elements per thread step: two 16-byte loads, one 16-byte store), the tile
// cast when a transposed copy is wanted, and the norm statistics the LayerNorm-fused cast reads.
#include "fp8/quantize_tile.cuh"

namespace fp8tron::fp8 {
using namespace cast;

namespace {

// ---- amax ------------------------------------------------------------------------------------------------

__global__ void __launch_bounds__(kThreads) amax_kernel(const uint16_t* x, size_t n, bool vectorized, float* amax,
                                                        Prologue prologue = Prologue::kNone,
                                                        const uint16_t* aux = nullptr) {
  __shared__ float red[kWarps + 1];
  const size_t stride = static_cast<size_t>(gridDim.x) * kThreads;
  const size_t start = static_cast<size_t>(blockIdx.x) * kThreads + threadIdx.x;
  float m = 0.0f;
  size_t scalar_begin = 0;
  if (vectorized) {
    const uint4* xv = reinterpret_cast<const uint4*>(x);
    const size_t nv = n / 8;
    size_t i = start;
    for (; i + 3 * stride < nv; i += 4 * stride) {
      const uint4* av = reinterpret_cast<const uint4*>(aux);
      const uint4 a = load_with_prologue(xv, av, i, prologue), b = load_with_prologue(xv, av, i + stride, prologue),
                  c = load_with_prologue(xv, av, i + 2 * stride, prologue),
                  d = load_with_prologue(xv, av, i + 3 * stride, prologue);
      m = abs_max8(a, m);
      m = abs_max8(b, m);
      m = abs_max8(c, m);
      m = abs_max8(d, m);
    }
    for (; i < nv; i += stride) m = abs_max8(load_with_prologue(xv, reinterpret_cast<const uint4*>(aux), i, prologue), m);
    scalar_begin = nv * 8;
  }
  for (size_t i = scalar_begin + start; i < n; i += stride) m = fmaxf(m, fabsf(scalar_with_prologue(x, aux, i, prologue)));
  m = block_max(m, red);
  if (threadIdx.x == 0) atomic_max_amax(amax, m);
}

// ---- per-tensor cast without transpose --------------------------------------------------------------------

template <Format F, bool kFromAmax>
__global__ void __launch_bounds__(kThreads)
    cast_flat_kernel(const uint16_t* x, size_t n, bool vectorized, uint8_t* out, const TensorScaleArgs s) {
  __shared__ float red[kWarps + 1];
  const float scale = tensor_scale<kFromAmax>(s, blockIdx.x == 0);
  const bool want_amax = s.amax_out != nullptr;
  const size_t stride = static_cast<size_t>(gridDim.x) * kThreads;
  const size_t start = static_cast<size_t>(blockIdx.x) * kThreads + threadIdx.x;
  float m = 0.0f;
  size_t scalar_begin = 0;
  if (vectorized) {  // 16 elements per step: two 16-byte loads, one 16-byte store
    const uint4* xv = reinterpret_cast<const uint4*>(x);
    uint4* ov = reinterpret_cast<uint4*>(out);
    const size_t nv = n / 16;
    for (size_t i = start; i < nv; i += stride) {
      const uint4* av = reinterpret_cast<const uint4*>(s.aux);
      const uint4 a = load_with_prologue(xv, av, 2 * i, s.prologue), b = load_with_prologue(xv, av, 2 * i + 1, s.prologue);
      if (want_amax) m = abs_max8(b, abs_max8(a, m));
      float fa[8], fb[8];
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        fa[j] = unpack(a, j) * scale;
        fb[j] = unpack(b, j) * scale;
      }
      const uint2 qa = encode8<F>(fa), qb = encode8<F>(fb);
      ov[i] = make_uint4(qa.x, qa.y, qb.x, qb.y);
    }
    scalar_begin = nv * 16;
  }
  for (size_t i = scalar_begin + start; i < n; i += stride) {
    const float v = scalar_with_prologue(x, s.aux, i, s.prologue);
    if (want_amax) m = fmaxf(m, fabsf(v));
    out[i] = encode1<F>(v * scale);
  }
  if (want_amax) {
    m = block_max(m, red);
    if (threadIdx.x == 0) atomic_max_amax(s.amax_out, m);
  }
}

// ---- LayerNorm statistics: one warp per row ----------------------------------------------------------------

__global__ void __launch_bounds__(kThreads)
    layer_norm_stats_kernel(const uint16_t* x, size_t rows, size_t cols, float eps, float* mean_out, float* rstd_out) {
  const size_t row = static_cast<size_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= rows) return;
  const uint4* xr = reinterpret_cast<const uint4*>(x + row * cols);
  const size_t nv = cols / 8;
  float mean = 0.0f;  // RMSNorm: squares about 0
  if (mean_out != nullptr) {
    float sum = 0.0f;
    for (size_t i = lane; i < nv; i += 32) {
      const uint4 v = __ldg(xr + i);
#pragma unroll
      for (int j = 0; j < 8; ++j) sum += unpack(v, j);
    }
    sum = kernels::warp_sum(sum);
    mean = sum / static_cast<float>(cols);
  }
  float sq = 0.0f;
  for (size_t i = lane; i < nv; i += 32) {
    const uint4 v = __ldg(xr + i);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float d = unpack(v, j) - mean;
      sq += d * d;
    }
  }
  sq = kernels::warp_sum(sq);
  if (lane == 0) {
    if (mean_out != nullptr) mean_out[row] = mean;
    rstd_out[row] = rsqrtf(sq / static_cast<float>(cols) + eps);
  }
}

template <bool kFromAmax, Format F>
void launch_flat(const uint16_t* x, size_t n, uint8_t* out, const TensorScaleArgs& s, CudaStream stream) {
  const bool vec = aligned16(x) && aligned16(out) && (s.aux == nullptr || aligned16(s.aux));
  cast_flat_kernel<F, kFromAmax><<<grid_for(vec ? n / 16 : n), kThreads, 0, stream>>>(x, n, vec, out, s);
  FP8TRON_CUDA_CHECK_LAUNCH("cast_flat_kernel");
}

template <bool kFromAmax>
void dispatch_flat(Format f, const uint16_t* x, size_t n, uint8_t* out, const TensorScaleArgs& s, CudaStream stream) {
  switch (f) {
    case Format::kE4M3: launch_flat<kFromAmax, Format::kE4M3>(x, n, out, s, stream); return;
    case Format::kE5M2: launch_flat<kFromAmax, Format::kE5M2>(x, n, out, s, stream); return;
    case Format::kHiF8: launch_flat<kFromAmax, Format::kHiF8>(x, n, out, s, stream); return;
    default: break;
  }
  FP8TRON_CHECK(false, std::string("no cast for format ") + format_name(f));
}

// Current scaling: the scale comes from the amax in out.amax, and is written with its inverse.
TensorScaleArgs current_scale_args(const Fp8TensorView& out, const CurrentScalingOptions& options) {
  TensorScaleArgs s;
  s.amax_in = out.amax;
  s.fp8_max = max_finite(out.format);
  s.power_2 = options.power_2_scales;
  s.epsilon = options.amax_epsilon;
  s.scale_out = out.scale;
  s.scale_inv_out = static_cast<float*>(out.scale_inv);
  return s;
}

// Per-tensor cast (delayed or current): flat kernel when no transposed copy is wanted.
template <bool kFromAmax>
void cast_tensor(const uint16_t* x, const Fp8TensorView& out, const TensorScaleArgs& s, CudaStream stream) {
  if (out.numel() == 0) return;
  if (out.data_t == nullptr) {
    FP8TRON_CHECK(out.data != nullptr, "quantize: neither data nor data_t given");
    FP8TRON_CHECK(s.column_sums == nullptr, "quantize: column sums need the transposed copy (tile kernel)");
    dispatch_flat<kFromAmax>(out.format, x, out.numel(), static_cast<uint8_t*>(out.data), s, stream);
    return;
  }
  TileArgs args = whole_tensor_tile_args(x, out);
  FP8TRON_CHECK(s.aux == nullptr || aligned16(s.aux), "quantize: the prologue's second operand must be 16-byte aligned");
  args.tensor = s;
  dispatch_tile<kFromAmax ? TileMode::kTensorFromAmax : TileMode::kTensorGiven>(out.format, args, stream);
}

// max |prologue(x)| of n values, max-accumulated into *amax (aux: the prologue's second operand).
void launch_amax(const uint16_t* x, size_t n, float* amax, Prologue prologue, const uint16_t* aux, CudaStream stream) {
  if (n == 0) return;
  const bool vec = aligned16(x) && (aux == nullptr || aligned16(aux));
  amax_kernel<<<grid_for(vec ? ceil_div(n, 8 * 4) : n), kThreads, 0, stream>>>(x, n, vec, amax, prologue, aux);
  FP8TRON_CUDA_CHECK_LAUNCH("amax_kernel");
}

}  // namespace

void norm_row_stats(const uint16_t* x, size_t rows, size_t cols, float eps, float* mean, float* rstd, CudaStream stream) {
  FP8TRON_CHECK(cols % 8 == 0 && aligned16(x), "norm_row_stats needs cols % 8 == 0 and a 16-byte aligned input");
  if (rows == 0) return;
  layer_norm_stats_kernel<<<static_cast<unsigned>(ceil_div(rows, kWarps)), kThreads, 0, stream>>>(x, rows, cols, eps, mean,
                                                                                                   rstd);
  FP8TRON_CUDA_CHECK_LAUNCH("layer_norm_stats_kernel");
}

void amax_bf16(const uint16_t* x, size_t n, float* amax, CudaStream stream) {
  launch_amax(x, n, amax, Prologue::kNone, nullptr, stream);
}

void quantize_tensor_delayed(const uint16_t* x, const Fp8TensorView& out, CudaStream stream,
                             const TensorCastFusion& fusion) {
  FP8TRON_CHECK(out.scaling_mode == ScalingMode::kTensor, "quantize_tensor_delayed needs tensor scaling");
  FP8TRON_CHECK(out.scale != nullptr, "delayed scaling needs out.scale");
  check_element_format(out.format, true);
  TensorScaleArgs s;
  s.scale_in = out.scale;
  s.scale_inv_out = static_cast<float*>(out.scale_inv);
  s.amax_out = out.amax;
  s.prologue = fusion.prologue;
  s.column_sums = fusion.column_sums;
  s.aux = fusion.aux;
  s.norm = fusion.norm;
  FP8TRON_CHECK(fusion.prologue != Prologue::kSwiglu || out.data_t != nullptr, "the SwiGLU cast needs the transposed copy");
  FP8TRON_CHECK(fusion.prologue != Prologue::kSwigluBackward ||
                    (out.data_t != nullptr && out.cols % (2 * kTile) == 0 && fusion.aux && aligned16(fusion.aux)),
                "the SwiGLU-backward cast needs the transposed copy, columns a multiple of 256 and the SwiGLU input");
  FP8TRON_CHECK(fusion.prologue != Prologue::kLayerNorm ||
                    (out.data_t != nullptr && fusion.norm.rstd && fusion.norm.gamma &&
                     aligned16(fusion.norm.gamma) && (!fusion.norm.beta || aligned16(fusion.norm.beta))),
                "the LayerNorm cast needs the transposed copy, statistics and 16-byte aligned gamma/beta");
  cast_tensor<false>(x, out, s, stream);
}

void quantize_tensor_current(const uint16_t* x, const Fp8TensorView& out, const CurrentScalingOptions& options,
                             CudaStream stream, const TensorCastFusion& fusion) {
  FP8TRON_CHECK(out.scaling_mode == ScalingMode::kTensor, "quantize_tensor_current needs tensor scaling");
  FP8TRON_CHECK(out.amax != nullptr && out.scale_inv != nullptr, "current scaling needs out.amax and out.scale_inv");
  check_element_format(out.format, true);
  FP8TRON_CHECK(fusion.prologue != Prologue::kLayerNorm && fusion.prologue != Prologue::kSwiglu &&
                    fusion.prologue != Prologue::kSwigluBackward,
                "the LayerNorm and SwiGLU casts take delayed (given) scales only");
  FP8TRON_CUDA_CHECK(cudaMemsetAsync(out.amax, 0, sizeof(float), stream));
  launch_amax(x, out.numel(), out.amax, fusion.prologue, fusion.aux, stream);
  TensorScaleArgs s = current_scale_args(out, options);
  s.prologue = fusion.prologue;
  s.column_sums = fusion.column_sums;
  s.aux = fusion.aux;
  cast_tensor<true>(x, out, s, stream);
}

void quantize_tensor_current_given_amax(const uint16_t* x, const Fp8TensorView& out, const CurrentScalingOptions& options,
                                        CudaStream stream) {
  FP8TRON_CHECK(out.scaling_mode == ScalingMode::kTensor, "quantize_tensor_current_given_amax needs tensor scaling");
  FP8TRON_CHECK(out.amax != nullptr && out.scale_inv != nullptr, "current scaling needs out.amax and out.scale_inv");
  check_element_format(out.format, true);
  cast_tensor<true>(x, out, current_scale_args(out, options), stream);
}

}  // namespace fp8tron::fp8
