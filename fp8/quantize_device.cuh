// What every cast kernel of quantize.h shares (quantize_tensor.cu, quantize_blocks.cu,
// quantize_segments.cu, dequantize.cu): the launch shape, bf16 unpacking, the FP8 encoders and
// decoders, the fused prologues (GeLU and its backward), block reductions, the per-tensor scale
// arguments and the host-side checks. Internal to fp8/.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "core/error.h"
#include "core/text.h"
#include "core/cuda/activations.cuh"
#include "core/cuda/cuda_check.h"
#include "core/cuda/warp_reduce.cuh"
#include "fp8/format_codec.h"
#include "fp8/formats.h"
#include "fp8/quantize.h"
#include "fp8/scale_math.h"

namespace fp8tron::fp8::cast {
using kernels::gelu_tanh;
using kernels::gelu_tanh_backward;
using kernels::sigmoid_fast;
using kernels::silu_backward_from_sigmoid;
using kernels::silu_fast;
using kernels::warp_max;

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kTile = 128;  // tile edge of quantize_tile_kernel

// ---- small device helpers ---------------------------------------------------------------------------

// Element j (0..7) of eight packed bf16 values, as float.
__device__ __forceinline__ float unpack(const uint4& v, int j) {
  const uint32_t w = j < 2 ? v.x : j < 4 ? v.y : j < 6 ? v.z : v.w;
  return __uint_as_float((j & 1) ? (w & 0xFFFF0000u) : (w << 16));
}

__device__ __forceinline__ float abs_max8(const uint4& v, float m) {
#pragma unroll
  for (int j = 0; j < 8; ++j) m = fmaxf(m, fabsf(unpack(v, j)));
  return m;
}

// bf16 rounding on the device by the hardware conversion (cvt.rn.bf16[x2].f32: round to nearest
// even, NaN to the canonical 0x7FFF): the bits of codec::float_to_bf16, the CPU twin's, in one
// instruction per pair instead of the integer sequence (the prologue casts are compute-bound).
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  const __nv_bfloat162 p = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&p);
}
__device__ __forceinline__ float round_bf16(float v) { return __bfloat162float(__float2bfloat16_rn(v)); }

__device__ __forceinline__ float prologue1(float v, float aux, Prologue p) {
  if (p == Prologue::kGeluTanh) return round_bf16(gelu_tanh(v));
  if (p == Prologue::kGeluTanhBackward) return round_bf16(gelu_tanh_backward(v, aux));
  return v;
}

// The prologue on eight packed bf16 values (aux: the second operand's eight values, read only by
// kGeluTanhBackward); results rounded to bf16 as a stored tensor is.
__device__ __forceinline__ uint4 apply_prologue(const uint4& v, Prologue p, const uint4& aux = make_uint4(0, 0, 0, 0)) {
  if (p == Prologue::kNone) return v;
  uint32_t w[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    w[k] = pack_bf16x2(prologue1(unpack(v, 2 * k), unpack(aux, 2 * k), p),
                       prologue1(unpack(v, 2 * k + 1), unpack(aux, 2 * k + 1), p));
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// Vector i of x after the prologue (aux: the second operand, same layout, or null).
__device__ __forceinline__ uint4 load_with_prologue(const uint4* x, const uint4* aux, size_t i, Prologue p) {
  const uint4 v = __ldg(x + i);
  if (p == Prologue::kNone) return v;
  return apply_prologue(v, p, p == Prologue::kGeluTanhBackward ? __ldg(aux + i) : make_uint4(0, 0, 0, 0));
}
__device__ __forceinline__ float scalar_with_prologue(const uint16_t* x, const uint16_t* aux, size_t i, Prologue p) {
  const float v = codec::bf16_to_float(x[i]);
  return p == Prologue::kNone ? v : prologue1(v, aux ? codec::bf16_to_float(aux[i]) : 0.0f, p);
}

template <Format F>
__device__ __forceinline__ uint32_t encode2(float a, float b) {  // a -> low byte
  if constexpr (F == Format::kE4M3) {
    return __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, __NV_E4M3);
  } else if constexpr (F == Format::kE5M2) {
    return __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, __NV_E5M2);
  } else {
    static_assert(F == Format::kHiF8, "unsupported element format");
    return static_cast<uint32_t>(codec::encode_hif8(a, true)) | (static_cast<uint32_t>(codec::encode_hif8(b, true)) << 8);
  }
}

// Eight values (v[j] * s) -> eight codes, byte j = element j.
template <Format F>
__device__ __forceinline__ uint2 encode8(const float (&v)[8]) {
  uint2 r;
  r.x = encode2<F>(v[0], v[1]) | (encode2<F>(v[2], v[3]) << 16);
  r.y = encode2<F>(v[4], v[5]) | (encode2<F>(v[6], v[7]) << 16);
  return r;
}

template <Format F>
__device__ __forceinline__ uint8_t encode1(float v) {
  return static_cast<uint8_t>(encode2<F>(v, 0.0f) & 0xFFu);
}

template <Format F>
__device__ __forceinline__ float decode1(uint8_t c) {
  if constexpr (F == Format::kE4M3) return codec::decode_e4m3(c);
  else if constexpr (F == Format::kE5M2) return codec::decode_e5m2(c);
  else return codec::decode_hif8(c);
}


// Max over the block; every thread gets the result. `red` holds kWarps + 1 floats.
__device__ __forceinline__ float block_max(float v, float* red) {
  v = warp_max(v);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (lane == 0) red[warp] = v;
  __syncthreads();
  if (threadIdx.x == 0) {
    float m = red[0];
#pragma unroll
    for (int w = 1; w < kWarps; ++w) m = fmaxf(m, red[w]);
    red[kWarps] = m;
  }
  __syncthreads();
  return red[kWarps];
}

// amax values are >= 0 and never NaN (fmaxf drops NaNs: the amax rule of scale_math.h, which
// max_ignoring_nan implements on the host), so the float order is the int order.
__device__ __forceinline__ void atomic_max_amax(float* address, float value) {
  atomicMax(reinterpret_cast<int*>(address), __float_as_int(value));
}

// ---- per-tensor scales (delayed: given; current: from the amax) -------------------------------------------

struct TensorScaleArgs {
  const float* scale_in = nullptr;  // delayed: the scale to use
  const float* amax_in = nullptr;   // current: derive the scale from this amax
  float fp8_max = 0.0f;
  bool power_2 = false;
  float epsilon = 0.0f;
  float* scale_out = nullptr;      // current: the derived scale (optional)
  float* scale_inv_out = nullptr;  // 1 / scale (optional)
  float* amax_out = nullptr;       // delayed: max-accumulate |x| (optional)
  Prologue prologue = Prologue::kNone;
  float* column_sums = nullptr;    // tile kernel only
  const uint16_t* aux = nullptr;   // kGeluTanhBackward's second operand
  NormPrologue norm;               // kLayerNorm (tile kernel only)
};

// The scale of a per-tensor cast; the first block (`first`) also stores scale and scale_inv.
template <bool kFromAmax>
__device__ __forceinline__ float tensor_scale(const TensorScaleArgs& s, bool first) {
  float scale;
  if constexpr (kFromAmax) {
    scale = scale_from_amax(*s.amax_in, s.fp8_max, s.power_2, s.epsilon);
  } else {
    scale = *s.scale_in;
  }
  if (first && threadIdx.x == 0) {
    if (kFromAmax && s.scale_out) *s.scale_out = scale;
    if (s.scale_inv_out) *s.scale_inv_out = __frcp_rn(scale);
  }
  return scale;
}

// ---- host-side launch helpers ---------------------------------------------------------------------------

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// Grid for grid-stride kernels: enough blocks to cover `work` thread-steps, capped at a few waves.
inline unsigned grid_for(size_t work) {
  int device = 0, sms = 132;
  FP8TRON_CUDA_CHECK(cudaGetDevice(&device));
  FP8TRON_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  const size_t blocks = ceil_div(std::max<size_t>(work, 1), kThreads);
  return static_cast<unsigned>(std::min<size_t>(blocks, static_cast<size_t>(sms) * 8));
}

inline void check_element_format(Format f, bool allow_hif8) {
  FP8TRON_CHECK(f == Format::kE4M3 || f == Format::kE5M2 || (allow_hif8 && f == Format::kHiF8),
                std::string("unsupported element format for this quantizer: ") + format_name(f));
}

inline void check_tile_shape(const uint16_t* x, const Fp8TensorView& t) {
  FP8TRON_CHECK(t.rows % 16 == 0 && t.cols % 16 == 0,
                strprintf("transposing and block-scaled quantization need rows and cols divisible by 16, got %zu x %zu",
                          t.rows, t.cols));
  FP8TRON_CHECK(t.rows <= static_cast<size_t>(65535) * kTile, "too many rows for the tile grid");
  FP8TRON_CHECK(aligned16(x) && aligned16(t.data) && aligned16(t.data_t), "quantize: pointers must be 16-byte aligned");
}

}  // namespace fp8tron::fp8::cast
