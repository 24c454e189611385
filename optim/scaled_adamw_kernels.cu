// The fused AdamW step over moments scaled per parameter (optim/scaled_adamw_kernels.h): three
// passes, one block per chunk of a parameter for the first two, one thread per parameter for the
// third.

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <type_traits>

#include "core/cuda/cuda_check.h"
#include "optim/adamw_math.cuh"
#include "optim/scaled_adamw_kernels.h"

namespace fp8tron::kernels {
namespace {

constexpr int kThreads = 256;

// How a storage type reads, writes and scales: the largest stored magnitude (TE's: half of fp16's
// range, E4M3's), and the factor a stored value is read back with.
template <class S> struct Storage;
template <> struct Storage<__half> {
  static constexpr float kRange = 65504.0f / 2.0f;
  __device__ static float load(const void* base, int64_t i) { return __half2float(static_cast<const __half*>(base)[i]); }
  __device__ static void store(void* base, int64_t i, float x) { static_cast<__half*>(base)[i] = __float2half_rn(x); }
  __device__ static float factor(float scale, float, bool) { return scale; }
};
template <> struct Storage<__nv_fp8_e4m3> {
  static constexpr float kRange = 448.0f;
  __device__ static float load(const void* base, int64_t i) {
    return static_cast<float>(static_cast<const __nv_fp8_e4m3*>(base)[i]);
  }
  // Round to nearest-even, saturated to +-448 (__NV_SATFINITE).
  __device__ static void store(void* base, int64_t i, float x) { static_cast<__nv_fp8_e4m3*>(base)[i] = __nv_fp8_e4m3(x); }
  // TE's Float8Tensor reads back with 1 / (1 / scale).
  __device__ static float factor(float, float multiplier, bool positive) { return positive ? __frcp_rn(multiplier) : 0.0f; }
};

struct NewScale {
  float multiplier, factor;
};

template <class S>
__device__ __forceinline__ NewScale new_scale(float amax) {
  const float scale = __fdiv_rn(amax, Storage<S>::kRange);
  const bool positive = scale > 0.0f;
  const float multiplier = positive ? __frcp_rn(scale) : 0.0f;
  return {multiplier, Storage<S>::factor(scale, multiplier, positive)};
}

__device__ __forceinline__ bool skipped(const AdamWDeviceScalars& sc) { return sc.found_inf != nullptr && *sc.found_inf != 0.0f; }

// Element i's new p, m and v, from the stored values read back with the parameter's factors.
template <class MS, class VS>
__device__ __forceinline__ void step_element(const ScaledAdamWStep& s, int64_t i, float mf, float vf, const StepConstants& c,
                                             float& p, float& m, float& v) {
  p = s.param[i];
  m = __fmul_rn(Storage<MS>::load(s.exp_avg.stored, i), mf);
  v = __fmul_rn(Storage<VS>::load(s.exp_avg_sq.stored, i), vf);
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

template <class MS, class VS>
__global__ void __launch_bounds__(kThreads) amax_pass(ScaledAdamWStep s, AdamWDeviceScalars sc, AdamWFloats h) {
  if (skipped(sc)) return;
  const StepConstants c = step_constants(h, sc);
  const ScaledChunk chunk = s.chunks[blockIdx.x];
  const float mf = s.exp_avg.factors[chunk.piece], vf = s.exp_avg_sq.factors[chunk.piece];
  float m_max = 0.0f, v_max = 0.0f;
  for (int64_t i = chunk.begin + threadIdx.x; i < chunk.end; i += kThreads) {
    float p, m, v;
    step_element<MS, VS>(s, i, mf, vf, c, p, m, v);
    m_max = fmaxf(m_max, fabsf(m));
    v_max = fmaxf(v_max, fabsf(v));
  }
  m_max = block_max(m_max);
  v_max = block_max(v_max);
  if (threadIdx.x == 0) {
    atomic_max(s.exp_avg.new_amax + chunk.piece, m_max);
    atomic_max(s.exp_avg_sq.new_amax + chunk.piece, v_max);
  }
}

template <class MS, class VS, class C>
__global__ void __launch_bounds__(kThreads) store_pass(ScaledAdamWStep s, AdamWDeviceScalars sc, AdamWFloats h) {
  if (skipped(sc)) return;
  const StepConstants c = step_constants(h, sc);
  const ScaledChunk chunk = s.chunks[blockIdx.x];
  const float mf = s.exp_avg.factors[chunk.piece], vf = s.exp_avg_sq.factors[chunk.piece];
  const NewScale ms = new_scale<MS>(s.exp_avg.new_amax[chunk.piece]), vs = new_scale<VS>(s.exp_avg_sq.new_amax[chunk.piece]);
  for (int64_t i = chunk.begin + threadIdx.x; i < chunk.end; i += kThreads) {
    float p, m, v;
    step_element<MS, VS>(s, i, mf, vf, c, p, m, v);
    s.param[i] = p;
    store_copy<C>(s.model_copy, i, p);
    Storage<MS>::store(s.exp_avg.stored, i, __fmul_rn(m, ms.multiplier));
    Storage<VS>::store(s.exp_avg_sq.stored, i, __fmul_rn(v, vs.multiplier));
  }
}

// After every chunk was stored with the old factors: the new ones.
template <class S>
__device__ __forceinline__ void record_scale(const ScaledStateBuffers& b, int64_t k) {
  const float amax = b.new_amax[k];
  b.factors[k] = new_scale<S>(amax).factor;
  b.amaxes[k] = amax;
}

template <class MS, class VS>
__global__ void __launch_bounds__(kThreads) scale_pass(ScaledAdamWStep s, AdamWDeviceScalars sc) {
  if (skipped(sc)) return;
  const int64_t k = s.first_piece + int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (k >= s.first_piece + s.num_pieces) return;
  record_scale<MS>(s.exp_avg, k);
  record_scale<VS>(s.exp_avg_sq, k);
}

template <class MS, class VS, class C>
void launch(const ScaledAdamWStep& s, const AdamWDeviceScalars& sc, const AdamWFloats& h, cudaStream_t stream) {
  const unsigned chunks = unsigned(s.num_chunks), pieces = unsigned((s.num_pieces + kThreads - 1) / kThreads);
  amax_pass<MS, VS><<<chunks, kThreads, 0, stream>>>(s, sc, h);
  FP8TRON_CUDA_CHECK_LAUNCH("scaled adamw amax_pass");
  store_pass<MS, VS, C><<<chunks, kThreads, 0, stream>>>(s, sc, h);
  FP8TRON_CUDA_CHECK_LAUNCH("scaled adamw store_pass");
  scale_pass<MS, VS><<<pieces, kThreads, 0, stream>>>(s, sc);
  FP8TRON_CUDA_CHECK_LAUNCH("scaled adamw scale_pass");
}

template <class MS, class VS>
void launch_with_copy(const ScaledAdamWStep& s, const AdamWDeviceScalars& sc, const AdamWFloats& h, cudaStream_t stream) {
  switch (s.model_copy ? s.copy_type : ModelCopyType::kNone) {
    case ModelCopyType::kNone: return launch<MS, VS, void>(s, sc, h, stream);
    case ModelCopyType::kFloat32: return launch<MS, VS, float>(s, sc, h, stream);
    case ModelCopyType::kBFloat16: return launch<MS, VS, __nv_bfloat16>(s, sc, h, stream);
    case ModelCopyType::kFloat16: return launch<MS, VS, __half>(s, sc, h, stream);
  }
}

template <class MS>
void launch_with_second(const ScaledAdamWStep& s, const AdamWDeviceScalars& sc, const AdamWFloats& h, cudaStream_t stream) {
  if (s.exp_avg_sq.type == ScaledType::kFloat16) return launch_with_copy<MS, __half>(s, sc, h, stream);
  launch_with_copy<MS, __nv_fp8_e4m3>(s, sc, h, stream);
}

}  // namespace

void scaled_fused_adamw(const ScaledAdamWStep& s, const AdamWDeviceScalars& scalars, const AdamWHyperParams& hyper,
                        cudaStream_t stream) {
  if (s.num_chunks <= 0) return;
  const AdamWFloats h = adamw_floats(hyper);
  if (s.exp_avg.type == ScaledType::kFloat16) return launch_with_second<__half>(s, scalars, h, stream);
  launch_with_second<__nv_fp8_e4m3>(s, scalars, h, stream);
}

}  // namespace fp8tron::kernels
