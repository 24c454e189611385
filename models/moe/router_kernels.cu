// The fused softmax top-k routing kernel of router_kernels.h. It replaces about fifteen torch
// operations per MoE layer (softmax, top-k, scatters into dense probs and maps, the aux losses'
// second softmax and top-k, column sums) whose host time, in the forward of a step that waits for
// the token counts at every layer, left the GPU idle.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>

#include "core/error.h"
#include "core/cuda/cuda_check.h"
#include "core/cuda/warp_reduce.cuh"
#include "models/moe/router_kernels.h"

namespace fp8tron::moe::kernels {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr unsigned kAll = 0xffffffffu;

__device__ __forceinline__ float load(const float* p, int64_t i) { return p[i]; }
__device__ __forceinline__ float load(const __nv_bfloat16* p, int64_t i) { return __bfloat162float(p[i]); }
__device__ __forceinline__ void store(float* p, int64_t i, float v) { p[i] = v; }
__device__ __forceinline__ void store(__nv_bfloat16* p, int64_t i, float v) { p[i] = __float2bfloat16_rn(v); }

using ::fp8tron::kernels::warp_max;
using ::fp8tron::kernels::warp_sum;

// Whether (a, ia) ranks before (b, ib) in torch.topk's order: larger first, NaN largest, ties to
// the lower index.
__device__ __forceinline__ bool ranks_before(float a, int ia, float b, int ib) {
  const bool na = isnan(a), nb = isnan(b);
  if (na != nb) return na;
  if (!na && a != b) return a > b;
  return ia < ib;
}

// The top-k indices of value(e) over e < experts into sel[0..k) (uniform over the warp).
template <typename Value>
__device__ void warp_topk(Value value, int64_t experts, int k, int* sel, int lane) {
  for (int j = 0; j < k; ++j) {
    float best = 0.0f;
    int best_e = -1;
    for (int64_t e = lane; e < experts; e += 32) {
      bool taken = false;
      for (int i = 0; i < j; ++i) taken = taken || sel[i] == int(e);
      if (taken) continue;
      const float v = value(e);
      if (best_e < 0 || ranks_before(v, int(e), best, best_e)) {
        best = v;
        best_e = int(e);
      }
    }
    for (int o = 16; o > 0; o /= 2) {
      const float other = __shfl_xor_sync(kAll, best, o);
      const int other_e = __shfl_xor_sync(kAll, best_e, o);
      if (other_e >= 0 && (best_e < 0 || ranks_before(other, other_e, best, best_e))) {
        best = other;
        best_e = other_e;
      }
    }
    sel[j] = best_e;
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads) topk_softmax_kernel(const TopkSoftmaxArgs a) {
  const int lane = threadIdx.x % 32;
  const int64_t t = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (t >= a.tokens) return;  // whole warps leave together: no block-wide synchronisation below
  const int64_t E = a.experts;
  const T* logits = static_cast<const T*>(a.logits) + t * E;
  float max_logit = -INFINITY;
  for (int64_t e = lane; e < E; e += 32) max_logit = fmaxf(max_logit, load(logits, e));
  max_logit = warp_max(max_logit);
  float denominator = 0.0f;
  for (int64_t e = lane; e < E; e += 32) denominator += expf(load(logits, e) - max_logit);
  denominator = warp_sum(denominator);
  auto score = [&](int64_t e) { return expf(load(logits, e) - max_logit) / denominator; };
  float* scores = a.scores + t * E;
  for (int64_t e = lane; e < E; e += 32) scores[e] = score(e);

  int sel[kMaxFusedTopk];
  const int k = int(a.topk);
  if (a.pre_softmax) warp_topk(score, E, k, sel, lane);
  else warp_topk([&](int64_t e) { return load(logits, e); }, E, k, sel, lane);
  // The weights of the k selected experts (uniform over the warp).
  float weight[kMaxFusedTopk];
  if (a.pre_softmax) {
    for (int j = 0; j < k; ++j) weight[j] = score(sel[j]);
  } else {
    const float top = load(logits, sel[0]);
    float sum = 0.0f;
    for (int j = 0; j < k; ++j) sum += expf(load(logits, sel[j]) - top);
    for (int j = 0; j < k; ++j) weight[j] = expf(load(logits, sel[j]) - top) / sum;
  }
  T* probs = static_cast<T*>(a.probs) + t * E;
  for (int64_t e = lane; e < E; e += 32) {
    float p = 0.0f;
    bool chosen = false;
    for (int j = 0; j < k; ++j)
      if (sel[j] == int(e)) {
        p = weight[j] * a.scaling_factor;
        chosen = true;
      }
    store(probs, e, p);
    a.map[t * E + e] = chosen;
  }
  if (lane == 0)
    for (int j = 0; j < k; ++j) atomicAdd(reinterpret_cast<unsigned long long*>(a.counts + sel[j]), 1ull);
  if (!a.aux_map) return;
  // The aux losses select on the scores (the same experts unless rounding ties them).
  int aux[kMaxFusedTopk];
  warp_topk([&](int64_t e) { return scores[e]; }, E, k, aux, lane);
  for (int64_t e = lane; e < E; e += 32) {
    bool chosen = false;
    for (int j = 0; j < k; ++j) chosen = chosen || aux[j] == int(e);
    a.aux_map[t * E + e] = chosen;
  }
  if (lane == 0 && a.aux_counts)
    for (int j = 0; j < k; ++j) atomicAdd(a.aux_counts + aux[j], 1.0f);
}

}  // namespace

void topk_softmax_routing(const TopkSoftmaxArgs& a, cudaStream_t stream) {
  FP8TRON_CHECK(a.topk >= 1 && a.topk <= kMaxFusedTopk && a.topk <= a.experts, "fused routing: top-k out of range");
  if (a.tokens == 0) return;
  const unsigned blocks = unsigned((a.tokens + kWarps - 1) / kWarps);
  if (a.logits_bf16) topk_softmax_kernel<__nv_bfloat16><<<blocks, kThreads, 0, stream>>>(a);
  else topk_softmax_kernel<float><<<blocks, kThreads, 0, stream>>>(a);
  FP8TRON_CUDA_CHECK_LAUNCH("moe topk_softmax_kernel");
}

}  // namespace fp8tron::moe::kernels
