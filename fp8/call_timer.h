// Mean time of a call on the GPU: CUDA events around `iters` back-to-back calls on the stream, after
// `warmup` untimed calls (plans, workspaces and caches exist by then; the start event is queued
// behind them, so they are not timed). The host's launch overhead counts where the GPU outruns it,
// as in training. Used by the grouped linear's one-time backend choice, the benchmarks and the
// GPU tests. Not during CUDA graph capture (events cannot be timed there).
#pragma once
#include <cuda_runtime_api.h>

#include <functional>

#include "core/cuda/cuda_check.h"

namespace fp8tron::fp8 {

// Milliseconds per call of fn, launched on `stream`.
inline double mean_call_ms(const std::function<void()>& fn, int iters, cudaStream_t stream, int warmup = 3) {
  for (int i = 0; i < warmup; ++i) fn();
  cudaEvent_t start, stop;
  FP8TRON_CUDA_CHECK(cudaEventCreate(&start));
  FP8TRON_CUDA_CHECK(cudaEventCreate(&stop));
  FP8TRON_CUDA_CHECK(cudaEventRecord(start, stream));
  for (int i = 0; i < iters; ++i) fn();
  FP8TRON_CUDA_CHECK(cudaEventRecord(stop, stream));
  FP8TRON_CUDA_CHECK(cudaEventSynchronize(stop));
  float ms = 0;
  FP8TRON_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return double(ms) / iters;
}

}  // namespace fp8tron::fp8
