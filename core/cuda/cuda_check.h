// Status checks for CUDA runtime calls (host code). A failure throws the internal error of
// core/error.h with file, line, function, the call's text and CUDA's own name and description.
#pragma once
#include <cuda_runtime_api.h>

#include <string>

#include "core/error.h"

#define FP8TRON_CUDA_CHECK(call)                                                                    \
  do {                                                                                              \
    const cudaError_t fp8tron_status_ = (call);                                                     \
    if (fp8tron_status_ != cudaSuccess) {                                                           \
      ::fp8tron::throw_internal_error(__FILE__, __LINE__, __func__,                                 \
                                      std::string("CUDA call failed: " #call ": ") +                \
                                          cudaGetErrorName(fp8tron_status_) + " (" +                \
                                          cudaGetErrorString(fp8tron_status_) + ")");               \
    }                                                                                               \
  } while (0)

// After a kernel launch: reports launch errors (bad configuration, no kernel image for this GPU)
// at the launch site, naming the kernel.
#define FP8TRON_CUDA_CHECK_LAUNCH(kernel_name)                                                      \
  do {                                                                                              \
    const cudaError_t fp8tron_status_ = cudaGetLastError();                                         \
    if (fp8tron_status_ != cudaSuccess) {                                                           \
      ::fp8tron::throw_internal_error(__FILE__, __LINE__, __func__,                                 \
                                      std::string("kernel launch failed: ") + (kernel_name) + ": " + \
                                          cudaGetErrorName(fp8tron_status_) + " (" +                \
                                          cudaGetErrorString(fp8tron_status_) + ")");               \
    }                                                                                               \
  } while (0)
