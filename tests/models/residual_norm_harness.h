// Runs the residual add + norm (models/norm/residual_norm.h) or a chain standing for it on fresh leaf
// copies of its inputs and backpropagates c_sum * sum + c_normed * normed (an undefined weight
// leaves that output out of the loss): the outputs and every input's gradient, for the CPU and GPU
// tests.
#pragma once
#include <torch/torch.h>

#include "models/norm/residual_norm.h"

namespace fp8tron::testing {

struct ResidualNormRun {
  torch::Tensor sum, normed, d_residual, d_branch, d_weight, d_bias;
  std::string node;  // the normed output's autograd node
};

template <class Op>
ResidualNormRun run_residual_norm(Op op, const torch::Tensor& residual, const torch::Tensor& branch,
                                  const torch::Tensor& weight, const torch::Tensor& bias, const torch::Tensor& c_sum,
                                  const torch::Tensor& c_normed) {
  auto leaf = [](const torch::Tensor& t) { return t.defined() ? t.detach().clone().requires_grad_(true) : t; };
  auto r = leaf(residual), b = leaf(branch), w = leaf(weight), bb = leaf(bias);
  const ResidualNormOutput out = op(r, b, w, bb);
  torch::Tensor loss = torch::zeros({}, out.normed.options());
  if (c_sum.defined()) loss = loss + (out.sum * c_sum).sum();
  if (c_normed.defined()) loss = loss + (out.normed * c_normed).sum();
  if (loss.requires_grad()) loss.backward();
  auto grad = [](const torch::Tensor& t) { return t.defined() ? t.grad() : torch::Tensor(); };
  const std::string node = out.normed.grad_fn() ? out.normed.grad_fn()->name() : "";
  return {out.sum.detach(), out.normed.detach(), grad(r), grad(b), grad(w), grad(bb), node};
}

}  // namespace fp8tron::testing
