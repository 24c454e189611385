// The CUDA stream the models' kernels on a tensor are launched on: the current stream of the
// tensor's device, as torch's own kernels use it.
#pragma once
#include <c10/cuda/CUDAStream.h>
#include <torch/torch.h>

namespace fp8tron {

inline cudaStream_t kernel_stream_of(const torch::Tensor& t) {
  return c10::cuda::getCurrentCUDAStream(t.device().index()).stream();
}

}  // namespace fp8tron
