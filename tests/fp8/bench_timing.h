// Timing for the benchmarks in this folder: CUDA events around `iters` back-to-back calls on the
// stream, after 3 untimed warm-up calls (plans, workspaces and caches exist by then). The host's
// launch overhead counts where the GPU outruns it, as in training.
#pragma once
#include <cuda_runtime_api.h>

#include <functional>

#include "fp8/cuda_check.h"

namespace fp8tron::fp8 {

// Milliseconds per call of fn, launched on `stream`.
inline double mean_call_ms(const std::function<void()>& fn, int iters, cudaStream_t stream) {
  for (int i = 0; i < 3; ++i) fn();
  FP8TRON_CUDA_CHECK(cudaDeviceSynchronize());
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
