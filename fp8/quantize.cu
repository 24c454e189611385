// CUDA kernels behind quantize.h. Three kernel families:
//   amax_kernel          max |x| of a bf16 buffer (16-byte loads, 4 in flight per thread,
//                        block reduction, one atomicMax per block)
//   cast_flat_kernel     per-tensor cast of a flat buffer without a transposed copy (16 elements
//                        per thread step: two 16-byte loads, one 16-byte store)
//   quantize_tile_kernel 128x128 tiles, 256 threads, each thread an 8x8 sub-tile held as eight
//                        16-byte vectors in registers. One pass computes whatever statistics the
//                        mode needs (tensor amax, 1x128 row/column amaxes, 128x128 block amax,
//                        1x32 MX amaxes), writes the row-wise codes with 8-byte stores and stages
//                        the transposed codes in shared memory (XOR-swizzled 8-byte chunks) so
//                        that the transposed copy also leaves with 16-byte stores.
// plus dequantize kernels for the emulated paths. Conversions: E4M3/E5M2 through the hardware
// cvt.rn.satfinite instruction (__nv_cvt_float2_to_fp8x2), HiF8/E8M0/bf16 through format_codec.h.
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <vector>

#include "core/error.h"
#include "core/text.h"
#include "core/cuda/activations.cuh"
#include "core/cuda/cuda_check.h"
#include "core/cuda/warp_reduce.cuh"
#include "fp8/format_codec.h"
#include "fp8/formats.h"
#include "fp8/quantize.h"
#include "fp8/scale_math.h"

namespace fp8tron::fp8 {

namespace {
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

// ---- (a) amax ---------------------------------------------------------------------------------------

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

// ---- (b)/(c) per-tensor cast without transpose ----------------------------------------------------------

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

// ---- 128x128 tile kernel: transposes and block scaling -------------------------------------------------

enum class TileMode { kTensorGiven, kTensorFromAmax, kBlock1x128, kBlock128x128, kMx };

struct TileArgs {
  const uint16_t* x = nullptr;
  size_t rows = 0, cols = 0;
  size_t x_rows = 0;         // rows present in x (<= rows): the rest are zero rows (segment padding)
  uint8_t* out = nullptr;    // [rows, cols] or null
  uint8_t* out_t = nullptr;  // [cols, rows] or null
  TensorScaleArgs tensor;    // tensor modes
  void* scale_inv = nullptr;    // block modes: fp32 (1x128, 128x128) or E8M0 (MX) for out
  void* scale_inv_t = nullptr;  // ... for out_t
  size_t ld = 0, ld_t = 0;      // strides of those layouts (fp8_tensor.h)
  float fp8_max = 0.0f;
  float fp8_max_rcp = 0.0f;  // MX
  bool power_2 = false;
  float epsilon = 0.0f;
};

// Shared-memory staging of the transposed codes: row c holds the 128 codes of column c of the tile
// in sixteen 8-byte chunks (chunk k = tile rows 8k..8k+7). Chunk k of row c is stored at slot
// k ^ swizzle(c), which keeps chunk pairs (2q, 2q+1) adjacent for the 16-byte reads and spreads the
// 8-byte writes of a half-warp over twice as many banks as a plain layout.
__device__ __forceinline__ int t_slot(int chunk, int c) { return chunk ^ (((c >> 3) & 7) << 1); }

// The cast of one 128x128 tile whose values (after any prologue) this thread holds: v[i] is row
// 8 ty + i, columns 8 tx .. 8 tx + 7 of the tile at (r0, c0). Column sums (tensor modes), the
// statistics and scales of the mode, then the row-wise and the transposed codes.
template <Format F, TileMode M>
__device__ __forceinline__ void cast_tile(const TileArgs& a, const uint4 (&v)[8], size_t r0, size_t c0, bool first) {
  constexpr bool kTensorMode = M == TileMode::kTensorGiven || M == TileMode::kTensorFromAmax;
  constexpr bool kColumnStats = M == TileMode::kBlock1x128 || M == TileMode::kMx;
  constexpr int kColBlocks = M == TileMode::kMx ? kTile / 32 : 1;  // column scale blocks per tile

  __shared__ __align__(16) uint8_t staged_t[kTile][kTile];
  __shared__ float col_partial[kColumnStats ? 16 : 1][kColumnStats ? kTile : 1];
  __shared__ float col_mult[kColumnStats ? kColBlocks : 1][kColumnStats ? kTile : 1];
  __shared__ float red[kWarps + 1];
  __shared__ float col_sum_partial[kTensorMode ? 16 : 1][kTensorMode ? kTile : 1];

  const int tid = threadIdx.x, tx = tid & 15, ty = tid >> 4;
  const size_t col = c0 + 8 * tx;  // this thread's 8 columns: col .. col+7
  const bool col_ok = col < a.cols;
  const size_t row0 = r0 + 8 * ty;  // this thread's 8 rows

  if constexpr (kTensorMode) {
    if (a.tensor.column_sums != nullptr) {  // the bias gradient: sums over the tile's rows, one atomic per column
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        float sum = 0.0f;
#pragma unroll
        for (int i = 0; i < 8; ++i) sum += unpack(v[i], j);
        col_sum_partial[ty][8 * tx + j] = sum;
      }
      __syncthreads();
      if (tid < kTile && c0 + tid < a.cols) {
        float sum = 0.0f;
#pragma unroll
        for (int g = 0; g < 16; ++g) sum += col_sum_partial[g][tid];
        atomicAdd(a.tensor.column_sums + c0 + tid, sum);
      }
    }
  }

  // ---- statistics and scales ----
  float uniform_scale = 1.0f;  // tensor modes and 128x128
  float row_scale[8];          // 1x128 and MX: scale of each of the thread's rows
#pragma unroll
  for (int i = 0; i < 8; ++i) row_scale[i] = 1.0f;

  if constexpr (M == TileMode::kTensorGiven || M == TileMode::kTensorFromAmax) {
    uniform_scale = tensor_scale<M == TileMode::kTensorFromAmax>(a.tensor, first);
    if (a.tensor.amax_out != nullptr) {  // uniform over the grid
      float m = 0.0f;
#pragma unroll
      for (int i = 0; i < 8; ++i) m = abs_max8(v[i], m);
      m = block_max(m, red);
      if (tid == 0) atomic_max_amax(a.tensor.amax_out, m);
    }
  } else if constexpr (M == TileMode::kBlock128x128) {
    float m = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; ++i) m = abs_max8(v[i], m);
    m = block_max(m, red);
    uniform_scale = scale_from_amax(m, a.fp8_max, a.power_2, a.epsilon);
    if (tid == 0) {
      const float inv = __frcp_rn(uniform_scale);
      const size_t rb = r0 / kTile, cb = c0 / kTile;
      if (a.out) static_cast<float*>(a.scale_inv)[rb * a.ld + cb] = inv;
      if (a.out_t) static_cast<float*>(a.scale_inv_t)[cb * a.ld_t + rb] = inv;
    }
  } else {
    // Row-wise runs: 1x128 spans the 16 threads of a half-warp, 1x32 spans 4 of them.
    if (a.out) {
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        float m = abs_max8(v[i], 0.0f);
        if constexpr (M == TileMode::kBlock1x128) {
          m = kernels::warp_max<16>(m);
          row_scale[i] = scale_from_amax(m, a.fp8_max, a.power_2, a.epsilon);
          const size_t row = row0 + i;
          if (tx == 0 && row < a.rows) {
            static_cast<float*>(a.scale_inv)[(c0 / kTile) * a.ld + row] = __frcp_rn(row_scale[i]);
          }
        } else {
          m = kernels::warp_max<4>(m);
          const uint8_t e = mx_block_scale(m, a.fp8_max_rcp);
          row_scale[i] = codec::e8m0_reciprocal(e);
          const size_t row = row0 + i;
          if ((tx & 3) == 0 && col_ok && row < a.rows) {
            static_cast<uint8_t*>(a.scale_inv)[row * a.ld + col / 32] = e;
          }
        }
      }
    }
    // Column runs (for the transposed copy): 128 rows = all 16 row groups; 32 rows = 4 groups.
    if (a.out_t) {
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        float m = 0.0f;
#pragma unroll
        for (int i = 0; i < 8; ++i) m = fmaxf(m, fabsf(unpack(v[i], j)));
        col_partial[ty][8 * tx + j] = m;
      }
      __syncthreads();
      if (tid < kTile) {
        const size_t c = c0 + tid;
#pragma unroll
        for (int b = 0; b < kColBlocks; ++b) {
          constexpr int kGroups = 16 / kColBlocks;  // row groups per column block
          float m = 0.0f;
#pragma unroll
          for (int g = 0; g < kGroups; ++g) m = fmaxf(m, col_partial[b * kGroups + g][tid]);
          if constexpr (M == TileMode::kBlock1x128) {
            const float s = scale_from_amax(m, a.fp8_max, a.power_2, a.epsilon);
            col_mult[b][tid] = s;
            if (c < a.cols) static_cast<float*>(a.scale_inv_t)[(r0 / kTile) * a.ld_t + c] = __frcp_rn(s);
          } else {
            const uint8_t e = mx_block_scale(m, a.fp8_max_rcp);
            col_mult[b][tid] = codec::e8m0_reciprocal(e);
            if (c < a.cols && r0 + 32 * b < a.rows) {
              static_cast<uint8_t*>(a.scale_inv_t)[c * a.ld_t + r0 / 32 + b] = e;
            }
          }
        }
      }
      __syncthreads();
    }
  }

  // ---- row-wise codes: 8 bytes per row per thread, a half-warp writes 128 contiguous bytes ----
  if (a.out && col_ok) {
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const size_t row = row0 + i;
      if (row < a.rows) {
        const float s = (kTensorMode || M == TileMode::kBlock128x128) ? uniform_scale : row_scale[i];
        float f[8];
#pragma unroll
        for (int j = 0; j < 8; ++j) f[j] = unpack(v[i], j) * s;
        *reinterpret_cast<uint2*>(a.out + row * a.cols + col) = encode8<F>(f);
      }
    }
  }

  // ---- transposed codes: stage 8x8 sub-tiles transposed, then 16-byte stores along rows ----
  if (a.out_t) {
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int c = 8 * tx + j;
      float s;
      if constexpr (kTensorMode || M == TileMode::kBlock128x128) {
        s = uniform_scale;
      } else if constexpr (M == TileMode::kBlock1x128) {
        s = col_mult[0][c];
      } else {
        s = col_mult[(ty >> 2) % kColBlocks][c];
      }
      float f[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) f[i] = unpack(v[i], j) * s;
      *reinterpret_cast<uint2*>(&staged_t[c][8 * t_slot(ty, c)]) = encode8<F>(f);
    }
    __syncthreads();
#pragma unroll
    for (int it = 0; it < (kTile * kTile / 16) / kThreads; ++it) {
      const int id = it * kThreads + tid;
      const int c = id >> 3, q = id & 7;  // column of the tile, 16-row chunk
      const size_t out_row = c0 + c, out_col = r0 + 16 * q;
      if (out_row < a.cols && out_col < a.rows) {
        *reinterpret_cast<uint4*>(a.out_t + out_row * a.rows + out_col) =
            *reinterpret_cast<const uint4*>(&staged_t[c][8 * t_slot(2 * q, c)]);
      }
    }
  }
}

// One 128x128 tile, rows [r0, r0 + 128) and columns [c0, c0 + 128) of the output; `first`: the
// tile that stores a tensor scale (once per tensor). kSwigluBwd: the prologue is
// Prologue::kSwigluBackward, compiled apart: the block computes the d(gate) tile at c0 and the
// d(up) tile of the same columns at c0 + cols / 2 from one read of the operands and one sigmoid per
// pair (the exponential and reciprocal bound this cast), then casts the two tiles in turn.
template <Format F, TileMode M, bool kSwigluBwd = false>
__device__ __forceinline__ void quantize_tile(const TileArgs& a, size_t r0, size_t c0, bool first) {
  constexpr bool kTensorMode = M == TileMode::kTensorGiven || M == TileMode::kTensorFromAmax;
  const int tid = threadIdx.x, tx = tid & 15, ty = tid >> 4;
  const size_t col = c0 + 8 * tx;  // this thread's 8 columns: col .. col+7
  const bool col_ok = col < a.cols;
  const size_t row0 = r0 + 8 * ty;  // this thread's 8 rows

  // Where x holds this thread's columns: kSwiglu reads the gate half of rows twice as long (the up
  // half follows at + cols); kSwigluBwd reads the output gradient, rows half as long.
  const size_t half = a.cols / 2;
  const size_t x_ld = kSwigluBwd ? half : a.tensor.prologue == Prologue::kSwiglu ? 2 * a.cols : a.cols;
  uint4 v[8];
  uint4 v_up[kSwigluBwd ? 8 : 1];  // kSwigluBwd: v is d(gate), v_up d(up)
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const size_t row = row0 + i;
    v[i] = (col_ok && row < a.x_rows) ? __ldg(reinterpret_cast<const uint4*>(a.x + row * x_ld + col))
                                    : make_uint4(0, 0, 0, 0);
  }
  if constexpr (kTensorMode) {
    if constexpr (kSwigluBwd) {
      // The gradient of h = [gate | up] from dy = v: models/mlp/swiglu_kernels.cu's backward per element,
      // with the fast exponential and reciprocal. Rows past x_rows stay zero.
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const size_t row = row0 + i;
        const bool in = col_ok && row < a.x_rows;
        const uint16_t* h = a.tensor.aux + row * a.cols + col;
        const uint4 gate = in ? __ldg(reinterpret_cast<const uint4*>(h)) : make_uint4(0, 0, 0, 0);
        const uint4 up = in ? __ldg(reinterpret_cast<const uint4*>(h + half)) : make_uint4(0, 0, 0, 0);
        uint32_t wg[4], wu[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          float rg[2], ru[2];
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int j = 2 * k + e;
            const float g = unpack(gate, j), dy = unpack(v[i], j), s = sigmoid_fast(g);
            rg[e] = silu_backward_from_sigmoid(dy * unpack(up, j), g, s);
            ru[e] = dy * (g * s);  // dy * silu_fast(g)
          }
          wg[k] = pack_bf16x2(rg[0], rg[1]);
          wu[k] = pack_bf16x2(ru[0], ru[1]);
        }
        v[i] = make_uint4(wg[0], wg[1], wg[2], wg[3]);
        v_up[i] = make_uint4(wu[0], wu[1], wu[2], wu[3]);
      }
    } else if (a.tensor.prologue == Prologue::kSwiglu) {
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const size_t row = row0 + i;
        if (!col_ok || row >= a.x_rows) continue;
        const uint4 up = __ldg(reinterpret_cast<const uint4*>(a.x + row * 2 * a.cols + a.cols + col));
        uint32_t w[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          float r[2];
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const float g = unpack(v[i], 2 * k + h);
            r[h] = round_bf16(silu_fast(g)) * unpack(up, 2 * k + h);
          }
          w[k] = pack_bf16x2(r[0], r[1]);
        }
        v[i] = make_uint4(w[0], w[1], w[2], w[3]);
      }
    } else if (a.tensor.prologue == Prologue::kLayerNorm) {
      const NormPrologue& n = a.tensor.norm;
      const uint4 g = col_ok ? __ldg(reinterpret_cast<const uint4*>(n.gamma + col)) : make_uint4(0, 0, 0, 0);
      const uint4 b = (col_ok && n.beta) ? __ldg(reinterpret_cast<const uint4*>(n.beta + col)) : make_uint4(0, 0, 0, 0);
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const size_t row = row0 + i;
        if (!col_ok || row >= a.x_rows) continue;
        const float mean = n.mean ? __ldg(n.mean + row) : 0.0f, rstd = __ldg(n.rstd + row);
        uint32_t w[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          const float lo = unpack(g, 2 * k) * (rstd * (unpack(v[i], 2 * k) - mean)) + unpack(b, 2 * k);
          const float hi = unpack(g, 2 * k + 1) * (rstd * (unpack(v[i], 2 * k + 1) - mean)) + unpack(b, 2 * k + 1);
          w[k] = pack_bf16x2(lo, hi);
        }
        v[i] = make_uint4(w[0], w[1], w[2], w[3]);
      }
    } else if (a.tensor.prologue != Prologue::kNone) {
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const size_t row = row0 + i;
        const bool in = col_ok && row < a.x_rows;
        const uint4 aux = (a.tensor.prologue == Prologue::kGeluTanhBackward && in)
                              ? __ldg(reinterpret_cast<const uint4*>(a.tensor.aux + row * a.cols + col))
                              : make_uint4(0, 0, 0, 0);
        if (in) v[i] = apply_prologue(v[i], a.tensor.prologue, aux);
      }
    }
  }
  cast_tile<F, M>(a, v, r0, c0, first);
  if constexpr (kSwigluBwd) {
    __syncthreads();  // the shared staging of the first tile is read out
    cast_tile<F, M>(a, v_up, r0, c0 + half, false);
  }
}

template <Format F, TileMode M, bool kSwigluBwd = false>
__global__ void __launch_bounds__(kThreads) quantize_tile_kernel(const TileArgs a) {
  quantize_tile<F, M, kSwigluBwd>(a, static_cast<size_t>(blockIdx.y) * kTile, static_cast<size_t>(blockIdx.x) * kTile,
                                  blockIdx.x == 0 && blockIdx.y == 0);
}

// ---- (g) grouped tensors: every segment in one launch ---------------------------------------------------

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

// ---- (f) dequantize --------------------------------------------------------------------------------------

template <Format F>
__global__ void __launch_bounds__(kThreads)
    dequantize_tensor_kernel(const uint8_t* q, size_t n, bool vectorized, const float* scale_inv, uint16_t* y) {
  const float factor = *scale_inv;
  const size_t stride = static_cast<size_t>(gridDim.x) * kThreads;
  const size_t start = static_cast<size_t>(blockIdx.x) * kThreads + threadIdx.x;
  size_t scalar_begin = 0;
  if (vectorized) {  // 16 codes in, 16 bf16 out
    const uint4* qv = reinterpret_cast<const uint4*>(q);
    uint4* yv = reinterpret_cast<uint4*>(y);
    const size_t nv = n / 16;
    for (size_t i = start; i < nv; i += stride) {
      const uint4 c = __ldg(qv + i);
      const uint32_t w[4] = {c.x, c.y, c.z, c.w};
      uint32_t o[8];
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        const uint32_t word = w[k / 2];
        const int shift = (k & 1) * 16;
        const uint16_t lo = codec::float_to_bf16(decode1<F>((word >> shift) & 0xFFu) * factor);
        const uint16_t hi = codec::float_to_bf16(decode1<F>((word >> (shift + 8)) & 0xFFu) * factor);
        o[k] = static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16);
      }
      yv[2 * i] = make_uint4(o[0], o[1], o[2], o[3]);
      yv[2 * i + 1] = make_uint4(o[4], o[5], o[6], o[7]);
    }
    scalar_begin = nv * 16;
  }
  for (size_t i = scalar_begin + start; i < n; i += stride) y[i] = codec::float_to_bf16(decode1<F>(q[i]) * factor);
}

// Block-scaled copies: each thread converts 8 consecutive codes of a row (one scale block, since
// 8 divides 32 and 128). cols % 8 == 0.
template <Format F>
__global__ void __launch_bounds__(kThreads) dequantize_blocks_kernel(const uint8_t* q, size_t rows, size_t cols,
                                                                     ScalingMode mode, size_t ld,
                                                                     const void* scale_inv, uint16_t* y) {
  const size_t groups = rows * (cols / 8);
  const size_t stride = static_cast<size_t>(gridDim.x) * kThreads;
  for (size_t g = static_cast<size_t>(blockIdx.x) * kThreads + threadIdx.x; g < groups; g += stride) {
    const size_t r = g / (cols / 8), c = (g % (cols / 8)) * 8;
    float factor;
    if (mode == ScalingMode::kMxfp8) {
      factor = codec::decode_e8m0(static_cast<const uint8_t*>(scale_inv)[r * ld + c / kMxBlock]);
    } else if (mode == ScalingMode::kBlock1x128) {
      factor = static_cast<const float*>(scale_inv)[(c / kBlockLen) * ld + r];
    } else {
      factor = static_cast<const float*>(scale_inv)[(r / kBlockLen) * ld + c / kBlockLen];
    }
    const uint2 codes = __ldg(reinterpret_cast<const uint2*>(q + r * cols + c));
    uint32_t o[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const uint32_t word = k < 2 ? codes.x : codes.y;
      const int shift = (k & 1) * 16;
      const uint16_t lo = codec::float_to_bf16(decode1<F>((word >> shift) & 0xFFu) * factor);
      const uint16_t hi = codec::float_to_bf16(decode1<F>((word >> (shift + 8)) & 0xFFu) * factor);
      o[k] = static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16);
    }
    *reinterpret_cast<uint4*>(y + r * cols + c) = make_uint4(o[0], o[1], o[2], o[3]);
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

// ---- host-side launch helpers ---------------------------------------------------------------------------

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// Grid for grid-stride kernels: enough blocks to cover `work` thread-steps, capped at a few waves.
unsigned grid_for(size_t work) {
  int device = 0, sms = 132;
  FP8TRON_CUDA_CHECK(cudaGetDevice(&device));
  FP8TRON_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  const size_t blocks = ceil_div(std::max<size_t>(work, 1), kThreads);
  return static_cast<unsigned>(std::min<size_t>(blocks, static_cast<size_t>(sms) * 8));
}

void check_element_format(Format f, bool allow_hif8) {
  FP8TRON_CHECK(f == Format::kE4M3 || f == Format::kE5M2 || (allow_hif8 && f == Format::kHiF8),
                std::string("unsupported element format for this quantizer: ") + format_name(f));
}

void check_tile_shape(const uint16_t* x, const Fp8TensorView& t) {
  FP8TRON_CHECK(t.rows % 16 == 0 && t.cols % 16 == 0,
                strprintf("transposing and block-scaled quantization need rows and cols divisible by 16, got %zu x %zu",
                          t.rows, t.cols));
  FP8TRON_CHECK(t.rows <= static_cast<size_t>(65535) * kTile, "too many rows for the tile grid");
  FP8TRON_CHECK(aligned16(x) && aligned16(t.data) && aligned16(t.data_t), "quantize: pointers must be 16-byte aligned");
}

template <TileMode M, Format F>
void launch_tile(const TileArgs& args, CudaStream stream) {
  const dim3 grid(static_cast<unsigned>(ceil_div(args.cols, kTile)), static_cast<unsigned>(ceil_div(args.rows, kTile)));
  if constexpr (M == TileMode::kTensorGiven) {
    if (args.tensor.prologue == Prologue::kSwigluBackward) {  // a block per tile pair: the gate half's columns
      const dim3 pairs(static_cast<unsigned>(args.cols / 2 / kTile), grid.y);
      quantize_tile_kernel<F, M, true><<<pairs, kThreads, 0, stream>>>(args);
      FP8TRON_CUDA_CHECK_LAUNCH("quantize_tile_kernel (SwiGLU backward)");
      return;
    }
  }
  quantize_tile_kernel<F, M><<<grid, kThreads, 0, stream>>>(args);
  FP8TRON_CUDA_CHECK_LAUNCH("quantize_tile_kernel");
}

template <TileMode M>
void dispatch_tile(Format f, const TileArgs& args, CudaStream stream) {
  switch (f) {
    case Format::kE4M3: launch_tile<M, Format::kE4M3>(args, stream); return;
    case Format::kE5M2: launch_tile<M, Format::kE5M2>(args, stream); return;
    case Format::kHiF8:
      if constexpr (M == TileMode::kTensorGiven || M == TileMode::kTensorFromAmax) {
        launch_tile<M, Format::kHiF8>(args, stream);
        return;
      }
      break;
    default: break;
  }
  FP8TRON_CHECK(false, std::string("no tile quantizer for format ") + format_name(f));
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
  check_tile_shape(x, out);
  FP8TRON_CHECK(s.aux == nullptr || aligned16(s.aux), "quantize: the prologue's second operand must be 16-byte aligned");
  TileArgs args;
  args.x = x;
  args.rows = out.rows;
  args.x_rows = out.rows;
  args.cols = out.cols;
  args.out = static_cast<uint8_t*>(out.data);
  args.out_t = static_cast<uint8_t*>(out.data_t);
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

// The arguments every block-scaled tile cast shares (checks included); false when x is empty.
bool block_tile_args(const uint16_t* x, const Fp8TensorView& out, const char* name, TileArgs& args) {
  check_element_format(out.format, false);
  FP8TRON_CHECK(out.data != nullptr || out.data_t != nullptr, "quantize: neither data nor data_t given");
  FP8TRON_CHECK(out.data == nullptr || out.scale_inv != nullptr, std::string(name) + ": data needs scale_inv");
  FP8TRON_CHECK(out.data_t == nullptr || out.scale_inv_t != nullptr, std::string(name) + ": data_t needs scale_inv_t");
  if (out.numel() == 0) return false;
  check_tile_shape(x, out);
  args.x = x;
  args.rows = out.rows;
  args.x_rows = out.rows;
  args.cols = out.cols;
  args.out = static_cast<uint8_t*>(out.data);
  args.out_t = static_cast<uint8_t*>(out.data_t);
  args.scale_inv = out.scale_inv;
  args.scale_inv_t = out.scale_inv_t;
  args.ld = out.layout().ld;
  args.ld_t = out.layout_t().ld;
  return true;
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

// ---- public API -----------------------------------------------------------------------------------------

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
  TensorScaleArgs s;
  s.prologue = fusion.prologue;
  s.column_sums = fusion.column_sums;
  s.aux = fusion.aux;
  s.amax_in = out.amax;
  s.fp8_max = max_finite(out.format);
  s.power_2 = options.power_2_scales;
  s.epsilon = options.amax_epsilon;
  s.scale_out = out.scale;
  s.scale_inv_out = static_cast<float*>(out.scale_inv);
  cast_tensor<true>(x, out, s, stream);
}

void quantize_tensor_current_given_amax(const uint16_t* x, const Fp8TensorView& out, const CurrentScalingOptions& options,
                                        CudaStream stream) {
  FP8TRON_CHECK(out.scaling_mode == ScalingMode::kTensor, "quantize_tensor_current_given_amax needs tensor scaling");
  FP8TRON_CHECK(out.amax != nullptr && out.scale_inv != nullptr, "current scaling needs out.amax and out.scale_inv");
  check_element_format(out.format, true);
  TensorScaleArgs s;
  s.amax_in = out.amax;
  s.fp8_max = max_finite(out.format);
  s.power_2 = options.power_2_scales;
  s.epsilon = options.amax_epsilon;
  s.scale_out = out.scale;
  s.scale_inv_out = static_cast<float*>(out.scale_inv);
  cast_tensor<true>(x, out, s, stream);
}

void quantize_blockwise(const uint16_t* x, const Fp8TensorView& out, const BlockScalingOptions& options,
                        CudaStream stream) {
  FP8TRON_CHECK(out.scaling_mode == ScalingMode::kBlock1x128 || out.scaling_mode == ScalingMode::kBlock128x128,
                "quantize_blockwise needs a 1x128 or 128x128 scaling mode");
  TileArgs args;
  if (!block_tile_args(x, out, "quantize_blockwise", args)) return;
  args.fp8_max = max_finite(out.format);
  args.power_2 = options.power_2_scales;
  args.epsilon = options.amax_epsilon;
  if (out.scaling_mode == ScalingMode::kBlock1x128) {
    dispatch_tile<TileMode::kBlock1x128>(out.format, args, stream);
  } else {
    dispatch_tile<TileMode::kBlock128x128>(out.format, args, stream);
  }
}

void quantize_mxfp8(const uint16_t* x, const Fp8TensorView& out, CudaStream stream) {
  FP8TRON_CHECK(out.scaling_mode == ScalingMode::kMxfp8, "quantize_mxfp8 needs the MXFP8 scaling mode");
  TileArgs args;
  if (!block_tile_args(x, out, "quantize_mxfp8", args)) return;
  args.fp8_max_rcp = 1.0f / max_finite(out.format);
  dispatch_tile<TileMode::kMx>(out.format, args, stream);
}

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

void dequantize(const Fp8TensorView& in, bool transposed_copy, uint16_t* y, CudaStream stream) {
  check_element_format(in.format, in.scaling_mode == ScalingMode::kTensor);
  const size_t rows = transposed_copy ? in.cols : in.rows, cols = transposed_copy ? in.rows : in.cols;
  const auto* q = static_cast<const uint8_t*>(transposed_copy ? in.data_t : in.data);
  const void* sinv = transposed_copy ? in.scale_inv_for_t() : in.scale_inv;
  FP8TRON_CHECK(q != nullptr && sinv != nullptr, "dequantize: missing codes or scales");
  const size_t n = rows * cols;
  if (n == 0) return;
  if (in.scaling_mode == ScalingMode::kTensor) {
    const bool vec = aligned16(q) && aligned16(y);
    const unsigned grid = grid_for(vec ? n / 16 : n);
    const auto* s = static_cast<const float*>(sinv);
    switch (in.format) {
      case Format::kE4M3: dequantize_tensor_kernel<Format::kE4M3><<<grid, kThreads, 0, stream>>>(q, n, vec, s, y); break;
      case Format::kE5M2: dequantize_tensor_kernel<Format::kE5M2><<<grid, kThreads, 0, stream>>>(q, n, vec, s, y); break;
      default: dequantize_tensor_kernel<Format::kHiF8><<<grid, kThreads, 0, stream>>>(q, n, vec, s, y); break;
    }
    FP8TRON_CUDA_CHECK_LAUNCH("dequantize_tensor_kernel");
    return;
  }
  FP8TRON_CHECK(cols % 8 == 0 && aligned16(y) && (reinterpret_cast<uintptr_t>(q) & 7u) == 0,
                "block-scaled dequantize needs cols % 8 == 0 and aligned pointers");
  const size_t ld = scale_layout(in.scaling_mode, rows, cols).ld;
  const unsigned grid = grid_for(n / 8);
  if (in.format == Format::kE4M3) {
    dequantize_blocks_kernel<Format::kE4M3><<<grid, kThreads, 0, stream>>>(q, rows, cols, in.scaling_mode, ld, sinv, y);
  } else {
    dequantize_blocks_kernel<Format::kE5M2><<<grid, kThreads, 0, stream>>>(q, rows, cols, in.scaling_mode, ld, sinv, y);
  }
  FP8TRON_CUDA_CHECK_LAUNCH("dequantize_blocks_kernel");
}

}  // namespace fp8tron::fp8
