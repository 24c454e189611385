#include "models/recompute/replay_state.h"

#include "models/recompute/recompute.h"

namespace fp8tron {
namespace {

thread_local bool first_pass = false;

}  // namespace

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
