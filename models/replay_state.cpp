#include "models/replay_state.h"

#include <ATen/Context.h>

#include <mutex>

#include "models/recompute.h"

namespace fp8tron {
namespace {

thread_local bool first_pass = false;

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

RngReplay::RngReplay(const RngSnapshot& replayed)
    : current_(RngSnapshot::capture(replayed.cuda.defined() ? replayed.cuda_device : torch::Device(torch::kCPU))) {
  replayed.restore();
}
RngReplay::~RngReplay() { current_.restore(); }

FirstPassGuard::FirstPassGuard(bool active) : previous_(first_pass) { first_pass = active; }
FirstPassGuard::~FirstPassGuard() { first_pass = previous_; }

std::vector<torch::Tensor> detached_like(const std::vector<torch::Tensor>& inputs) {
  std::vector<torch::Tensor> out;
  out.reserve(inputs.size());
  for (const auto& t : inputs) out.push_back(t.defined() ? t.detach().requires_grad_(t.requires_grad()) : t);
  return out;
}

bool recompute_first_pass_active() { return first_pass; }

}  // namespace fp8tron
