#include "models/recompute/rng_snapshot.h"

#include <ATen/Context.h>

#include <mutex>

namespace fp8tron {
namespace {

torch::Tensor generator_state(const torch::Device& device) {
  at::Generator g = at::globalContext().defaultGenerator(device);
  std::lock_guard<std::mutex> lock(g.mutex());
  return g.get_state();
}

void set_generator_state(const torch::Device& device, const torch::Tensor& state) {
  at::Generator g = at::globalContext().defaultGenerator(device);
  std::lock_guard<std::mutex> lock(g.mutex());
  g.set_state(state);
}

}  // namespace

RngSnapshot RngSnapshot::capture(const torch::Device& device) {
  RngSnapshot s;
  s.cpu = generator_state(torch::Device(torch::kCPU));
  if (device.is_cuda()) {
    s.cuda_device = device.has_index() ? device : torch::Device(torch::kCUDA, 0);
    s.cuda = generator_state(s.cuda_device);
  }
  return s;
}

void RngSnapshot::restore() const {
  set_generator_state(torch::Device(torch::kCPU), cpu);
  if (cuda.defined()) set_generator_state(cuda_device, cuda);
}

}  // namespace fp8tron
