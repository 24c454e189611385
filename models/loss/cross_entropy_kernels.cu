// Fused cross-entropy kernels: one thread block per row of logits, 16-byte vector loads, an online
// softmax (running maximum and rescaled sum) per thread, combined across the block.

#include <cfloat>

#include "core/cuda/cuda_check.h"
#include "models/loss/cross_entropy_kernels.h"

namespace fp8tron::kernels {
namespace {

constexpr int kThreads = 512;

// The running (maximum, sum of exp(x - maximum)) of a stream of values.
struct OnlineSoftmax {
  float max = -FLT_MAX;
  float sum = 0.0f;
  __device__ void add(float x) {
    if (x > max) {
      sum = sum * expf(max - x) + 1.0f;
      max = x;
    } else {
      sum += expf(x - max);
    }
  }
  __device__ void merge(float other_max, float other_sum) {
    const float m = fmaxf(max, other_max);
    sum = (max == -FLT_MAX ? 0.0f : sum * expf(max - m)) + (other_max == -FLT_MAX ? 0.0f : other_sum * expf(other_max - m));
    max = m;
  }
};

// Elements per 16-byte vector.
template <class T> constexpr int kVector = 16 / sizeof(T);

template <class T>
__global__ void __launch_bounds__(kThreads) row_stats_kernel(const T* __restrict__ logits, const int64_t* __restrict__ target,
                                                             int64_t vocab, bool vectorized, float* row_max, float* sum_exp,
                                                             float* target_logit) {
  const int64_t row = blockIdx.x;
  const T* x = logits + row * vocab;
  OnlineSoftmax acc;
  if (vectorized) {
    constexpr int V = kVector<T>;
    const int64_t vectors = vocab / V;
    for (int64_t i = threadIdx.x; i < vectors; i += kThreads) {
      const uint4 raw = reinterpret_cast<const uint4*>(x)[i];
      const T* v = reinterpret_cast<const T*>(&raw);
#pragma unroll
      for (int k = 0; k < V; ++k) acc.add(to_float(v[k]));
    }
  } else {
    for (int64_t i = threadIdx.x; i < vocab; i += kThreads) acc.add(to_float(x[i]));
  }
  // Combine within the warp, then across warps.
  for (int offset = 16; offset > 0; offset /= 2) {
    const float m = __shfl_xor_sync(0xffffffff, acc.max, offset);
    const float s = __shfl_xor_sync(0xffffffff, acc.sum, offset);
    acc.merge(m, s);
  }
  __shared__ float maxes[kThreads / 32], sums[kThreads / 32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) {
    maxes[warp] = acc.max;
    sums[warp] = acc.sum;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    OnlineSoftmax total;
    for (int w = 0; w < kThreads / 32; ++w) total.merge(maxes[w], sums[w]);
    row_max[row] = total.max;
    sum_exp[row] = total.sum;
    const int64_t t = target[row];
    target_logit[row] = t >= 0 && t < vocab ? to_float(x[t]) : 0.0f;
  }
}

template <class T>
__global__ void __launch_bounds__(kThreads) backward_kernel(T* __restrict__ logits, const int64_t* __restrict__ target,
                                                            const float* __restrict__ lse, const float* __restrict__ grad_loss,
                                                            int64_t vocab, bool vectorized) {
  const int64_t row = blockIdx.x;
  T* x = logits + row * vocab;
  const float l = lse[row], g = grad_loss[row];
  const int64_t t = target[row];
  if (vectorized) {
    constexpr int V = kVector<T>;
    const int64_t vectors = vocab / V;
    for (int64_t i = threadIdx.x; i < vectors; i += kThreads) {
      uint4 raw = reinterpret_cast<uint4*>(x)[i];
      T* v = reinterpret_cast<T*>(&raw);
#pragma unroll
      for (int k = 0; k < V; ++k) {
        const int64_t j = i * V + k;
        const float p = expf(to_float(v[k]) - l);
        v[k] = from_float<T>((p - (j == t ? 1.0f : 0.0f)) * g);
      }
      reinterpret_cast<uint4*>(x)[i] = raw;
    }
  } else {
    for (int64_t j = threadIdx.x; j < vocab; j += kThreads) {
      const float p = expf(to_float(x[j]) - l);
      x[j] = from_float<T>((p - (j == t ? 1.0f : 0.0f)) * g);
    }
  }
}

template <class T>
bool can_vectorize(const void* p, int64_t vocab) {
  return vocab % kVector<T> == 0 && reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

template <class T>
void launch_stats(const void* logits, const int64_t* target, int64_t rows, int64_t vocab, float* row_max, float* sum_exp,
                  float* target_logit, cudaStream_t stream) {
  if (rows == 0) return;
  row_stats_kernel<T><<<unsigned(rows), kThreads, 0, stream>>>(static_cast<const T*>(logits), target, vocab,
                                                                can_vectorize<T>(logits, vocab), row_max, sum_exp,
                                                                target_logit);
  FP8TRON_CUDA_CHECK_LAUNCH("cross_entropy row_stats_kernel");
}

template <class T>
void launch_backward(void* logits, const int64_t* target, const float* lse, const float* grad_loss, int64_t rows,
                     int64_t vocab, cudaStream_t stream) {
  if (rows == 0) return;
  backward_kernel<T><<<unsigned(rows), kThreads, 0, stream>>>(static_cast<T*>(logits), target, lse, grad_loss, vocab,
                                                               can_vectorize<T>(logits, vocab));
  FP8TRON_CUDA_CHECK_LAUNCH("cross_entropy backward_kernel");
}

}  // namespace

void cross_entropy_row_stats(const void* logits, FloatType dtype, const int64_t* target, int64_t rows, int64_t vocab,
                             float* row_max, float* sum_exp, float* target_logit, cudaStream_t stream) {
  switch (dtype) {
    case FloatType::kFloat32: return launch_stats<float>(logits, target, rows, vocab, row_max, sum_exp, target_logit, stream);
    case FloatType::kBFloat16:
      return launch_stats<__nv_bfloat16>(logits, target, rows, vocab, row_max, sum_exp, target_logit, stream);
    case FloatType::kFloat16: return launch_stats<__half>(logits, target, rows, vocab, row_max, sum_exp, target_logit, stream);
  }
}

void cross_entropy_backward(void* logits, FloatType dtype, const int64_t* target, const float* lse,
                            const float* grad_loss, int64_t rows, int64_t vocab, cudaStream_t stream) {
  switch (dtype) {
    case FloatType::kFloat32: return launch_backward<float>(logits, target, lse, grad_loss, rows, vocab, stream);
    case FloatType::kBFloat16: return launch_backward<__nv_bfloat16>(logits, target, lse, grad_loss, rows, vocab, stream);
    case FloatType::kFloat16: return launch_backward<__half>(logits, target, lse, grad_loss, rows, vocab, stream);
  }
}

}  // namespace fp8tron::kernels
