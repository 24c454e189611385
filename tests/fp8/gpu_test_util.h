// Device-side helpers for the FP8 GPU tests: device detection, RAII buffers, a device mirror of
// HostQuantized, event timing and a one-line report format ("[fp8-bench] ...") easy to grep.
#pragma once
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "core/cuda/cuda_check.h"
#include "fp8_test_util.h"
#include "fp8/call_timer.h"

namespace fp8tron::fp8::testing {

inline bool gpu_available() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

inline int compute_capability_major() {
  int device = 0, major = 0;
  FP8TRON_CUDA_CHECK(cudaGetDevice(&device));
  FP8TRON_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  return major;
}

#define FP8_REQUIRE_GPU() \
  if (!::fp8tron::fp8::testing::gpu_available()) GTEST_SKIP() << "no CUDA device"

#define FP8_REQUIRE_HOPPER()                                                       \
  FP8_REQUIRE_GPU();                                                               \
  if (::fp8tron::fp8::testing::compute_capability_major() != 9)                    \
  GTEST_SKIP() << "FP8 cuBLASLt paths are validated on sm_90 (Hopper) only"

template <class T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t n, int fill_byte = -1) : n_(n) {
    if (n_ > 0) FP8TRON_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&ptr_), n_ * sizeof(T)));
    if (n_ > 0 && fill_byte >= 0) FP8TRON_CUDA_CHECK(cudaMemset(ptr_, fill_byte, n_ * sizeof(T)));
  }
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size()) { upload(host); }
  ~DeviceBuffer() {
    if (ptr_) cudaFree(ptr_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  T* get() const { return ptr_; }
  size_t size() const { return n_; }
  void upload(const std::vector<T>& host) {
    FP8TRON_CHECK(host.size() == n_, "upload size mismatch");
    if (n_ > 0) FP8TRON_CUDA_CHECK(cudaMemcpy(ptr_, host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice));
  }
  std::vector<T> download() const {
    std::vector<T> host(n_);
    if (n_ > 0) FP8TRON_CUDA_CHECK(cudaMemcpy(host.data(), ptr_, n_ * sizeof(T), cudaMemcpyDeviceToHost));
    return host;
  }

 private:
  T* ptr_ = nullptr;
  size_t n_ = 0;
};

// Device twin of HostQuantized, initialised the same way (0xEE everywhere, scale/amax copied).
struct DeviceQuantized {
  DeviceBuffer<uint8_t> data, data_t, scale_inv, scale_inv_t;
  DeviceBuffer<float> scale{1}, amax{1};
  Fp8TensorView view;

  explicit DeviceQuantized(const HostQuantized& h)
      : data(h.data.size(), 0xEE),
        data_t(h.data_t.size(), 0xEE),
        scale_inv(h.scale_inv.size(), 0xEE),
        scale_inv_t(h.scale_inv_t.size(), 0xEE) {
    scale.upload({h.scale});
    amax.upload({h.amax});
    view = h.view;
    view.data = h.view.data ? data.get() : nullptr;
    view.data_t = h.view.data_t ? data_t.get() : nullptr;
    view.scale = scale.get();
    view.amax = amax.get();
    view.scale_inv = scale_inv.get();
    view.scale_inv_t = h.view.scale_inv_t ? scale_inv_t.get() : nullptr;
  }
  // Copies everything back into a HostQuantized of the same configuration.
  void download_into(HostQuantized& h) const {
    h.data = data.download();
    h.data_t = data_t.download();
    h.scale_inv = scale_inv.download();
    h.scale_inv_t = scale_inv_t.download();
    h.scale = scale.download()[0];
    h.amax = amax.download()[0];
  }
};

// Average milliseconds per call of `fn` on the default stream.
inline double time_ms(const std::function<void()>& fn, int warmup = 5, int iters = 20) {
  return mean_call_ms(fn, iters, nullptr, warmup);
}

struct RunTimes {
  double median_ms = 0, mean_ms = 0, min_ms = 0, max_ms = 0;
  int runs = 0;
};

// Benchmark timing on the default stream: fn(i) is the i-th run (rotate buffers with i). First
// runs until `warmup_ms` of wall time have passed (clocks and power settle, plans and autotuning
// are done), then times `iters` runs one by one with events between them; the median is the
// figure to report (robust to the odd slow run), mean/min/max show the spread.
inline RunTimes time_runs(const std::function<void(int)>& fn, int iters = 50, double warmup_ms = 300.0) {
  int call = 0;
  const auto t0 = std::chrono::steady_clock::now();
  do {
    for (int i = 0; i < 5; ++i) fn(call++);
    FP8TRON_CUDA_CHECK(cudaDeviceSynchronize());
  } while (std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() < warmup_ms);
  std::vector<cudaEvent_t> ev(static_cast<size_t>(iters) + 1);
  for (auto& e : ev) FP8TRON_CUDA_CHECK(cudaEventCreate(&e));
  FP8TRON_CUDA_CHECK(cudaEventRecord(ev[0], nullptr));
  for (int i = 0; i < iters; ++i) {
    fn(call++);
    FP8TRON_CUDA_CHECK(cudaEventRecord(ev[static_cast<size_t>(i) + 1], nullptr));
  }
  FP8TRON_CUDA_CHECK(cudaEventSynchronize(ev.back()));
  std::vector<double> ms(static_cast<size_t>(iters));
  for (size_t i = 0; i < ms.size(); ++i) {
    float e = 0.0f;
    FP8TRON_CUDA_CHECK(cudaEventElapsedTime(&e, ev[i], ev[i + 1]));
    ms[i] = e;
  }
  for (auto& e : ev) cudaEventDestroy(e);
  RunTimes r;
  r.runs = iters;
  for (double m : ms) r.mean_ms += m / iters;
  std::sort(ms.begin(), ms.end());
  r.min_ms = ms.front();
  r.max_ms = ms.back();
  r.median_ms = ms.size() % 2 ? ms[ms.size() / 2] : 0.5 * (ms[ms.size() / 2 - 1] + ms[ms.size() / 2]);
  return r;
}

inline std::string device_name() {
  int device = 0;
  cudaDeviceProp prop{};
  if (cudaGetDevice(&device) != cudaSuccess || cudaGetDeviceProperties(&prop, device) != cudaSuccess) return "?";
  return prop.name;
}

}  // namespace fp8tron::fp8::testing
