// The 128x128 tile cast every recipe shares: transposed copies of per-tensor casts, the 1x128
// and 128x128 blocks of blockwise scaling and MXFP8's 1x32 blocks, with the fused prologues
// (norm, SwiGLU and its backward). 256 threads per tile, each an 8x8 sub-tile held as eight
// 16-byte vectors in registers; one pass computes whatever statistics the mode needs, writes the
// row-wise codes with 8-byte stores and stages the transposed codes in shared memory
// (XOR-swizzled 8-byte chunks) so that the transposed copy also leaves with 16-byte stores.
// Internal to fp8/.
#pragma once
#include "fp8/quantize_device.cuh"

namespace fp8tron::fp8::cast {

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

// The tile arguments of a whole tensor `out` cast from x (shape checked); the mode's scales are
// the caller's.
inline TileArgs whole_tensor_tile_args(const uint16_t* x, const Fp8TensorView& out) {
  check_tile_shape(x, out);
  TileArgs args;
  args.x = x;
  args.rows = out.rows;
  args.x_rows = out.rows;
  args.cols = out.cols;
  args.out = static_cast<uint8_t*>(out.data);
  args.out_t = static_cast<uint8_t*>(out.data_t);
  return args;
}

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

}  // namespace fp8tron::fp8::cast
