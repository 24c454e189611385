// The autograd side of --delay-wgrad-compute (core/deferred_work.h) for the linear nodes of fp8/
// and models/: a node computes its input's gradient at once and, for the weights whose gradients
// are held, returns none to autograd but hands the queue a closure that computes them later, then
// adds them where autograd would have put them: into the fp32 main gradient by the wgrad GEMM
// (gradient-accumulation fusion), or through accumulate_param_grad with AccumulateGrad's own
// arithmetic. The weights stay inputs of the node, so the graph, and the order in which
// autograd reaches them, are those of the run without the flag.
#pragma once
#include <torch/torch.h>

#include <memory>
#include <vector>

#include "core/deferred_work.h"

namespace fp8tron {

// Adds `grad` to `param`'s gradient exactly as autograd's AccumulateGrad does at the end of a
// backward pass (cast to the parameter's dtype, then added in place, or adopted when there is none).
void accumulate_param_grad(const torch::Tensor& param, const torch::Tensor& grad);

// The keys under which the queue reports the parameters (their TensorImpls).
std::vector<DeferredWork::Key> param_keys(const std::vector<torch::Tensor>& params);

// Runs `wgrad` now when `queue` is null, else holds it (completing `params`).
void run_or_hold_wgrad(const std::shared_ptr<DeferredWork>& queue, std::function<void()> wgrad,
                       const std::vector<torch::Tensor>& params);

}  // namespace fp8tron
