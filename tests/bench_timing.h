// GPU timing for the on-request micro-benchmarks (tests/bench_*.cpp): CUDA events around `iters`
// back-to-back calls on the current stream, after `warmup` untimed ones.
#pragma once
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include <functional>

#include "fp8/cuda_check.h"

namespace fp8tron::testing {

inline double gpu_ms_per_call(int iters, const std::function<void()>& fn, int warmup = 2) {
  for (int i = 0; i < warmup; ++i) fn();
  FP8TRON_CUDA_CHECK(cudaDeviceSynchronize());
  cudaEvent_t start, stop;
  FP8TRON_CUDA_CHECK(cudaEventCreate(&start));
  FP8TRON_CUDA_CHECK(cudaEventCreate(&stop));
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream().stream();
  FP8TRON_CUDA_CHECK(cudaEventRecord(start, stream));
  for (int i = 0; i < iters; ++i) fn();
  FP8TRON_CUDA_CHECK(cudaEventRecord(stop, stream));
  FP8TRON_CUDA_CHECK(cudaEventSynchronize(stop));
  float ms = 0;
  FP8TRON_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
  FP8TRON_CUDA_CHECK(cudaEventDestroy(start));
  FP8TRON_CUDA_CHECK(cudaEventDestroy(stop));
  return ms / iters;
}

}  // namespace fp8tron::testing
