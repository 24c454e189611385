#include "models/linear/overlapped_linear.h"

namespace fp8tron {

std::shared_ptr<overlap::LinearKernels> overlap_kernels(const torch::Tensor& w, const torch::Tensor& b,
                                                        const std::shared_ptr<fp8::Fp8Site>& site,
                                                        const TensorParallelContext& tp, const overlap::TpLinearPlan& plan,
                                                        fp8::Prologue prologue) {
  if (site) return std::make_shared<Fp8LinearKernels>(w, b, *site, *tp.comm, plan, prologue);
  return std::make_shared<PlainLinearKernels>(w, b);
}

torch::Tensor overlapped_column_linear(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b,
                                       const std::shared_ptr<fp8::Fp8Site>& site, const TensorParallelContext& tp,
                                       const overlap::TpLinearPlan& plan) {
  return overlap::tp_linear(x, w, b, {}, overlap_kernels(w, b, site, tp, plan), plan, *tp.comm, w.size(0));
}

torch::Tensor overlapped_row_linear(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& bias,
                                    const std::shared_ptr<fp8::Fp8Site>& site, const TensorParallelContext& tp,
                                    const overlap::TpLinearPlan& plan, fp8::Prologue prologue) {
  auto y = overlap::tp_linear(x, w, {}, {}, overlap_kernels(w, {}, site, tp, plan, prologue), plan, *tp.comm, w.size(0));
  return bias.defined() ? y + bias : y;
}

torch::Tensor overlapped_norm_fp8_linear(const torch::Tensor& x, const NormOptions& norm, const torch::Tensor& gamma,
                                         const torch::Tensor& beta, const torch::Tensor& w, const torch::Tensor& b,
                                         fp8::Fp8Site& site, const TensorParallelContext& tp,
                                         const overlap::TpLinearPlan& plan) {
  auto kernels = std::make_shared<Fp8LinearKernels>(w, b, site, *tp.comm, plan, fp8::Prologue::kNone);
  kernels->fuse_norm(norm.kind == Normalization::RMSNorm, gamma, beta, norm.epsilon, norm.zero_centered_gamma);
  std::vector<torch::Tensor> norm_params = {gamma};
  if (beta.defined()) norm_params.push_back(beta);
  return overlap::tp_linear(x, w, b, norm_params, kernels, plan, *tp.comm, w.size(0));
}

}  // namespace fp8tron
