// The fused AdamW step over states of which some are scaled per parameter
// (optim/scaled_adamw_kernels.h): three passes, one block per chunk of a parameter for the first
// two, one thread per parameter for the third.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "core/cuda/cuda_check.h"
#include "optim/adamw_math.cuh"
#include "optim/scaled_adamw_kernels.h"

namespace fp8tron::kernels {
namespace {

constexpr int kThreads = 256;

// TE's largest stored magnitude: half of fp16's range, E4M3's.
constexpr float kFloat16Range = 65504.0f / 2.0f;
constexpr float kFloat8Range = 448.0f;

__device__ __forceinline__ bool is_scaled(StateType t) {
  return t == StateType::kFloat16Scaled || t == StateType::kFloat8E4M3Scaled;
}

// A state's factor for `piece` (1 for a plain one: unused).
__device__ __forceinline__ float factor_of(const StateBuffers& b, int64_t piece) {
  return is_scaled(b.type) ? b.factors[piece] : 1.0f;
}

// Element i read back to fp32: plain types exactly, scaled ones as stored x factor. (The type is
// the same for every thread: the switch does not diverge.)
__device__ __forceinline__ float load(const StateBuffers& b, int64_t i, float factor) {
  switch (b.type) {
    case StateType::kFloat32: return static_cast<const float*>(b.data)[i];
    case StateType::kBFloat16: return __bfloat162float(static_cast<const __nv_bfloat16*>(b.data)[i]);
    case StateType::kFloat16Scaled: return __fmul_rn(__half2float(static_cast<const __half*>(b.data)[i]), factor);
    case StateType::kFloat8E4M3Scaled:
      return __fmul_rn(static_cast<float>(static_cast<const __nv_fp8_e4m3*>(b.data)[i]), factor);
  }
  return 0.0f;
}

// Element i stored: plain types rounded to nearest-even, scaled ones as x x multiplier rounded to
// nearest-even (E4M3 saturated to +-448, __NV_SATFINITE).
__device__ __forceinline__ void store(const StateBuffers& b, int64_t i, float x, float multiplier) {
  switch (b.type) {
    case StateType::kFloat32: static_cast<float*>(b.data)[i] = x; return;
    case StateType::kBFloat16: static_cast<__nv_bfloat16*>(b.data)[i] = __float2bfloat16_rn(x); return;
    case StateType::kFloat16Scaled: static_cast<__half*>(b.data)[i] = __float2half_rn(__fmul_rn(x, multiplier)); return;
    case StateType::kFloat8E4M3Scaled: static_cast<__nv_fp8_e4m3*>(b.data)[i] = __nv_fp8_e4m3(__fmul_rn(x, multiplier)); return;
  }
}

struct NewScale {
  float multiplier, factor;
};

// The scale TE chooses from a scaled state's new absolute maximum: stored values are multiplied
// by 1 / scale and read back with the scale (fp16), or with 1 / (1 / scale) (TE's Float8Tensor).
__device__ __forceinline__ NewScale new_scale(StateType t, float amax) {
  const bool fp16 = t == StateType::kFloat16Scaled;
  const float scale = __fdiv_rn(amax, fp16 ? kFloat16Range : kFloat8Range);
  const bool positive = scale > 0.0f;
  const float multiplier = positive ? __frcp_rn(scale) : 0.0f;
  return {multiplier, fp16 ? scale : positive ? __frcp_rn(multiplier) : 0.0f};
}

__device__ __forceinline__ bool skipped(const AdamWDeviceScalars& sc) { return sc.found_inf != nullptr && *sc.found_inf != 0.0f; }

// The factors of a chunk's parameter.
struct Factors {
  float p, m, v;
};

__device__ __forceinline__ Factors factors_of(const ScaledAdamWStep& s, int64_t piece) {
  return {factor_of(s.param, piece), factor_of(s.exp_avg, piece), factor_of(s.exp_avg_sq, piece)};
}

// Element i's new p, m and v.
__device__ __forceinline__ void step_element(const ScaledAdamWStep& s, int64_t i, const Factors& f, const StepConstants& c,
                                             float& p, float& m, float& v) {
  p = load(s.param, i, f.p);
  m = load(s.exp_avg, i, f.m);
  v = load(s.exp_avg_sq, i, f.v);
  adamw_element(p, s.grad[i], m, v, c);
}

// The block's largest value of `x` (non-negative), in thread 0.
__device__ __forceinline__ float block_max(float x) {
  __shared__ float warps[kThreads / 32];
  for (int offset = 16; offset > 0; offset /= 2) x = fmaxf(x, __shfl_down_sync(0xffffffffu, x, offset));
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();  // warps[] may still be read by a previous call
  if (lane == 0) warps[warp] = x;
  __syncthreads();
  x = 0.0f;
  if (warp == 0) {
    x = lane < kThreads / 32 ? warps[lane] : 0.0f;
    for (int offset = 16; offset > 0; offset /= 2) x = fmaxf(x, __shfl_down_sync(0xffffffffu, x, offset));
  }
  return x;
}

// Non-negative floats order as their bit patterns do.
__device__ __forceinline__ void atomic_max(float* at, float value) {
  atomicMax(reinterpret_cast<int*>(at), __float_as_int(value));
}

// A scaled state's block maximum into its parameter's new maximum (plain states: nothing).
__device__ __forceinline__ void reduce_amax(const StateBuffers& b, int64_t piece, float x) {
  if (!is_scaled(b.type)) return;
  x = block_max(x);
  if (threadIdx.x == 0) atomic_max(b.new_amax + piece, x);
}

__global__ void __launch_bounds__(kThreads) amax_pass(ScaledAdamWStep s, AdamWDeviceScalars sc, AdamWFloats h) {
  if (skipped(sc)) return;
  const StepConstants c = step_constants(h, sc);
  const ScaledChunk chunk = s.chunks[blockIdx.x];
  const Factors f = factors_of(s, chunk.piece);
  float p_max = 0.0f, m_max = 0.0f, v_max = 0.0f;
  for (int64_t i = chunk.begin + threadIdx.x; i < chunk.end; i += kThreads) {
    float p, m, v;
    step_element(s, i, f, c, p, m, v);
    p_max = fmaxf(p_max, fabsf(p));
    m_max = fmaxf(m_max, fabsf(m));
    v_max = fmaxf(v_max, fabsf(v));
  }
  reduce_amax(s.param, chunk.piece, p_max);
  reduce_amax(s.exp_avg, chunk.piece, m_max);
  reduce_amax(s.exp_avg_sq, chunk.piece, v_max);
}

// The multiplier a state is stored with (plain states: unused).
__device__ __forceinline__ float multiplier_of(const StateBuffers& b, int64_t piece) {
  return is_scaled(b.type) ? new_scale(b.type, b.new_amax[piece]).multiplier : 1.0f;
}

template <class C>
__global__ void __launch_bounds__(kThreads) store_pass(ScaledAdamWStep s, AdamWDeviceScalars sc, AdamWFloats h) {
  if (skipped(sc)) return;
  const StepConstants c = step_constants(h, sc);
  const ScaledChunk chunk = s.chunks[blockIdx.x];
  const Factors f = factors_of(s, chunk.piece);
  const float pm = multiplier_of(s.param, chunk.piece), mm = multiplier_of(s.exp_avg, chunk.piece),
              vm = multiplier_of(s.exp_avg_sq, chunk.piece);
  for (int64_t i = chunk.begin + threadIdx.x; i < chunk.end; i += kThreads) {
    float p, m, v;
    step_element(s, i, f, c, p, m, v);
    store_copy<C>(s.model_copy, i, p);  // from the fp32 value, before p is stored
    store(s.param, i, p, pm);
    store(s.exp_avg, i, m, mm);
    store(s.exp_avg_sq, i, v, vm);
  }
}

// After every chunk was stored with the old factors: a scaled state's new ones.
__device__ __forceinline__ void record_scale(const StateBuffers& b, int64_t k) {
  if (!is_scaled(b.type)) return;
  const float amax = b.new_amax[k];
  b.factors[k] = new_scale(b.type, amax).factor;
  b.amaxes[k] = amax;
}

__global__ void __launch_bounds__(kThreads) scale_pass(ScaledAdamWStep s, AdamWDeviceScalars sc) {
  if (skipped(sc)) return;
  const int64_t k = s.first_piece + int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (k >= s.first_piece + s.num_pieces) return;
  record_scale(s.param, k);
  record_scale(s.exp_avg, k);
  record_scale(s.exp_avg_sq, k);
}

template <class C>
void launch(const ScaledAdamWStep& s, const AdamWDeviceScalars& sc, const AdamWFloats& h, cudaStream_t stream) {
  const unsigned chunks = unsigned(s.num_chunks), pieces = unsigned((s.num_pieces + kThreads - 1) / kThreads);
  amax_pass<<<chunks, kThreads, 0, stream>>>(s, sc, h);
  FP8TRON_CUDA_CHECK_LAUNCH("scaled adamw amax_pass");
  store_pass<C><<<chunks, kThreads, 0, stream>>>(s, sc, h);
  FP8TRON_CUDA_CHECK_LAUNCH("scaled adamw store_pass");
  scale_pass<<<pieces, kThreads, 0, stream>>>(s, sc);
  FP8TRON_CUDA_CHECK_LAUNCH("scaled adamw scale_pass");
}

}  // namespace

void scaled_fused_adamw(const ScaledAdamWStep& s, const AdamWDeviceScalars& scalars, const AdamWHyperParams& hyper,
                        cudaStream_t stream) {
  if (s.num_chunks <= 0) return;
  const AdamWFloats h = adamw_floats(hyper);
  switch (s.model_copy ? s.copy_type : ModelCopyType::kNone) {
    case ModelCopyType::kNone: return launch<void>(s, scalars, h, stream);
    case ModelCopyType::kFloat32: return launch<float>(s, scalars, h, stream);
    case ModelCopyType::kBFloat16: return launch<__nv_bfloat16>(s, scalars, h, stream);
    case ModelCopyType::kFloat16: return launch<__half>(s, scalars, h, stream);
  }
}

}  // namespace fp8tron::kernels
