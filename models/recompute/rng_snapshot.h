// The states of the generators dropout draws from: the CPU one, and the CUDA one of the device the
// activations live on. Activation recomputation replays a layer's forward with them; the rerun
// engine runs a whole iteration again from them. Capturing reads host-side state only (the CUDA
// generator's seed and offset): no wait on the GPU.
#pragma once
#include <torch/torch.h>

namespace fp8tron {

struct RngSnapshot {
  torch::Tensor cpu, cuda;
  torch::Device cuda_device = torch::Device(torch::kCUDA, 0);

  static RngSnapshot capture(const torch::Device& device);
  void restore() const;
};

}  // namespace fp8tron
