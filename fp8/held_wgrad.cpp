#include "fp8/held_wgrad.h"

#include <torch/csrc/autograd/functions/accumulate_grad.h>

namespace fp8tron {

void accumulate_param_grad(const torch::Tensor& param, const torch::Tensor& grad) {
  if (!grad.defined()) return;
  torch::NoGradGuard no_grad;  // a backward pass without create_graph
  // The engine casts a node's output to its input's dtype before AccumulateGrad sees it.
  at::Tensor new_grad = grad.scalar_type() == param.scalar_type() ? grad : grad.to(param.scalar_type());
  at::Tensor variable_grad = param.grad();
  torch::autograd::AccumulateGrad::accumulateGrad(param, variable_grad, new_grad, 1,
                                                   [&](at::Tensor&& g) { param.mutable_grad() = std::move(g); });
}

std::vector<DeferredWork::Key> param_keys(const std::vector<torch::Tensor>& params) {
  std::vector<DeferredWork::Key> keys;
  for (const auto& p : params)
    if (p.defined()) keys.push_back(p.unsafeGetTensorImpl());
  return keys;
}

void run_or_hold_wgrad(const std::shared_ptr<DeferredWork>& queue, std::function<void()> wgrad,
                       const std::vector<torch::Tensor>& params) {
  if (!queue) {
    wgrad();
    return;
  }
  queue->hold(
      [work = std::move(wgrad)] {
        torch::NoGradGuard no_grad;
        work();
      },
      param_keys(params));
}

}  // namespace fp8tron
