#include "models/residual_norm.h"

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "models/kernel_float_of.h"
#include "models/residual_norm_kernels.h"

namespace fp8tron {
namespace {
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

cudaStream_t stream_of(const torch::Tensor& t) { return c10::cuda::getCurrentCUDAStream(t.device().index()).stream(); }

const void* data_or_null(const torch::Tensor& t) { return t.defined() ? t.data_ptr() : nullptr; }

kernels::ResidualNormShape shape_of(const torch::Tensor& x, bool rms, double epsilon, bool zero_centered_gamma) {
  kernels::ResidualNormShape s;
  s.hidden = x.size(-1);
  s.rows = x.numel() / s.hidden;
  s.dtype = *kernel_float_of(x);
  s.rms = rms;
  s.epsilon = float(epsilon);
  s.gamma_offset = zero_centered_gamma ? 1.0f : 0.0f;
  return s;
}

// Inputs: residual, branch (with has_branch false: the norm of residual alone), weight, bias (with
// has_bias false: none; always for RMSNorm). The absent ones come as empty placeholders: a C++
// autograd function takes no undefined tensor as an input (it asks every input for its device).
// Outputs {sum, normed}, or {normed} without a branch.
struct ResidualNormFunction : torch::autograd::Function<ResidualNormFunction> {
  static variable_list forward(AutogradContext* ctx, const torch::Tensor& residual, const torch::Tensor& branch,
                               const torch::Tensor& weight, const torch::Tensor& bias, bool has_branch, bool has_bias,
                               bool rms, double epsilon, bool zero_centered_gamma) {
    const c10::cuda::CUDAGuard device(residual.device());
    ctx->set_materialize_grads(false);  // an unused output's gradient stays undefined (zero), not a zero tensor
    const auto x = residual.contiguous();
    const auto b = has_branch ? branch.contiguous() : torch::Tensor();
    const auto gamma = weight.contiguous(), beta = has_bias ? bias.contiguous() : torch::Tensor();
    const auto s = shape_of(x, rms, epsilon, zero_centered_gamma);
    auto normed = torch::empty_like(x);
    auto sum = b.defined() ? torch::empty_like(x) : x;
    const auto stats = x.options().dtype(torch::kFloat32);
    auto mean = rms ? torch::Tensor() : torch::empty({s.rows}, stats);
    auto rstd = torch::empty({s.rows}, stats);
    kernels::residual_norm_forward(s, x.data_ptr(), data_or_null(b), gamma.data_ptr(), data_or_null(beta),
                                   b.defined() ? sum.data_ptr() : nullptr, normed.data_ptr(),
                                   mean.defined() ? mean.data_ptr<float>() : nullptr, rstd.data_ptr<float>(), stream_of(x));
    ctx->save_for_backward({sum, gamma, mean, rstd});
    ctx->saved_data["has_branch"] = b.defined();
    ctx->saved_data["has_bias"] = beta.defined();
    ctx->saved_data["rms"] = rms;
    ctx->saved_data["zero_centered_gamma"] = zero_centered_gamma;
    if (b.defined()) return {sum, normed};
    return {normed};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto &sum = saved[0], &gamma = saved[1], &mean = saved[2], &rstd = saved[3];
    const bool has_branch = ctx->saved_data["has_branch"].toBool(), has_bias = ctx->saved_data["has_bias"].toBool();
    const c10::cuda::CUDAGuard device(sum.device());
    // The gradient of a sum arrives expanded (stride 0), of a cast in another dtype.
    auto as_rows = [&](const torch::Tensor& g) { return g.defined() ? g.to(sum.scalar_type()).contiguous() : g; };
    const auto d_sum = has_branch ? as_rows(grads[0]) : torch::Tensor();
    const auto d_normed = as_rows(grads[has_branch ? 1 : 0]);
    torch::Tensor d_in, d_weight, d_bias;
    if (!d_normed.defined()) {
      d_in = d_sum;  // the norm's output was not used: no norm gradients
    } else {
      const auto s = shape_of(sum, ctx->saved_data["rms"].toBool(), 0.0, ctx->saved_data["zero_centered_gamma"].toBool());
      d_in = torch::empty_like(sum);
      const int64_t workspace_rows = kernels::residual_norm_workspace_rows(s);
      torch::Tensor workspace;
      if (ctx->needs_input_grad(2) || (has_bias && ctx->needs_input_grad(3))) {
        d_weight = torch::empty_like(gamma);
        if (has_bias) d_bias = torch::empty_like(gamma);
        workspace = torch::empty({2 * workspace_rows, s.hidden}, sum.options().dtype(torch::kFloat32));
      }
      kernels::residual_norm_backward(s, d_normed.data_ptr(), data_or_null(d_sum), sum.data_ptr(), gamma.data_ptr(),
                                      mean.defined() ? mean.data_ptr<float>() : nullptr, rstd.data_ptr<float>(),
                                      d_in.data_ptr(), d_weight.defined() ? d_weight.data_ptr() : nullptr,
                                      d_bias.defined() ? d_bias.data_ptr() : nullptr,
                                      workspace.defined() ? workspace.data_ptr<float>() : nullptr, workspace_rows,
                                      stream_of(sum));
    }
    // residual and branch take the same gradient (an add passes it on to both).
    return {d_in, has_branch ? d_in : torch::Tensor(), d_weight, d_bias, torch::Tensor(), torch::Tensor(),
            torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

bool same_kind(const torch::Tensor& a, const torch::Tensor& b) {
  return a.scalar_type() == b.scalar_type() && a.device() == b.device();
}

// Whether the kernels take these tensors (else the unfused chain runs).
bool kernels_apply(const torch::Tensor& residual, const torch::Tensor& branch, const NormOptions& o,
                   const torch::Tensor& weight, const torch::Tensor& bias) {
  if (!residual.is_cuda() || !kernel_float_of(residual) || residual.dim() == 0) return false;
  if (o.size < 1 || o.size > kernels::kResidualNormMaxHidden || residual.size(-1) != o.size) return false;
  if (branch.defined() && !(same_kind(branch, residual) && branch.sizes() == residual.sizes())) return false;
  if (!same_kind(weight, residual) || weight.dim() != 1 || weight.size(0) != o.size) return false;
  const bool uses_bias = o.kind == Normalization::LayerNorm && bias.defined();
  return !uses_bias || (same_kind(bias, residual) && bias.dim() == 1 && bias.size(0) == o.size);
}

}  // namespace

ResidualNormOutput unfused_residual_add_norm(const torch::Tensor& residual, const torch::Tensor& branch,
                                             const NormOptions& options, const torch::Tensor& weight,
                                             const torch::Tensor& bias) {
  auto sum = branch.defined() ? residual + branch : residual;
  return {sum, torch_norm(sum, options, weight, bias)};
}

ResidualNormOutput residual_add_norm(const torch::Tensor& residual, const torch::Tensor& branch, const NormOptions& options,
                                     const torch::Tensor& weight, const torch::Tensor& bias) {
  if (!kernels_apply(residual, branch, options, weight, bias))
    return unfused_residual_add_norm(residual, branch, options, weight, bias);
  const bool rms = options.kind == Normalization::RMSNorm;
  const bool has_bias = !rms && bias.defined();
  const auto none = torch::empty({0}, residual.options());
  const auto out = ResidualNormFunction::apply(residual, branch.defined() ? branch : none, weight, has_bias ? bias : none,
                                               branch.defined(), has_bias, rms, options.epsilon, options.zero_centered_gamma);
  if (!branch.defined()) return {residual, out[0]};
  return {out[0], out[1]};
}

torch::Tensor apply_norm(const torch::Tensor& x, const NormOptions& options, const torch::Tensor& weight,
                         const torch::Tensor& bias) {
  return residual_add_norm(x, torch::Tensor(), options, weight, bias).normed;
}

}  // namespace fp8tron
