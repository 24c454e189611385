#include "models/norm/residual_norm.h"

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "models/kernel_float_of.h"
#include "models/kernel_stream_of.h"
#include "models/norm/residual_norm_kernels.h"

namespace fp8tron {
namespace {
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;


const void* data_or_null(const torch::Tensor& t) { return t.defined() ? t.data_ptr() : nullptr; }

// Where the backward puts a norm parameter's gradient (NormGradRequest): its fp32 main gradient,
// or a new tensor in its dtype, `for_autograd`. None for an undefined parameter or when not wanted.
kernels::SummedGradOut norm_param_grad_out(const torch::Tensor& param, bool wanted, const MainGradsPtr& main_grads,
                                           torch::Tensor& for_autograd) {
  if (!param.defined() || !wanted) return {};
  if (main_grads && main_grads->fuses_into(param)) return {param.grad().data_ptr(), true, !main_grads->take(param)};
  for_autograd = torch::empty_like(param);
  return {for_autograd.data_ptr(), false, false};
}

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
// has_bias false: none; always for RMSNorm), the branch's pending bias (with has_branch_bias false:
// none). The absent ones come as empty placeholders: a C++ autograd function takes no undefined
// tensor as an input (it asks every input for its device). Outputs {sum, normed}, or {normed}
// without a branch.
struct ResidualNormFunction : torch::autograd::Function<ResidualNormFunction> {
  static variable_list forward(AutogradContext* ctx, const torch::Tensor& residual, const torch::Tensor& branch,
                               const torch::Tensor& weight, const torch::Tensor& bias, const torch::Tensor& branch_bias,
                               bool has_branch, bool has_bias, bool has_branch_bias, bool rms, double epsilon,
                               bool zero_centered_gamma, const MainGradsPtr& main_grads) {
    ctx->set_materialize_grads(false);  // an unused output's gradient stays undefined (zero), not a zero tensor
    const NormPrologue norm{norm_options_of(rms, epsilon, zero_centered_gamma, weight.size(0)), weight,
                            has_bias ? bias : torch::Tensor()};
    const auto pending_bias = has_branch_bias ? branch_bias : torch::Tensor();
    const auto f = norm_prologue_forward(residual, has_branch ? branch : torch::Tensor(), norm, pending_bias);
    ctx->save_for_backward({f.saved.sum, weight, norm.bias, f.saved.mean, f.saved.rstd, pending_bias});
    ctx->saved_data["has_branch"] = has_branch;
    ctx->saved_data["has_bias"] = has_bias;
    ctx->saved_data["rms"] = rms;
    ctx->saved_data["zero_centered_gamma"] = zero_centered_gamma;
    if (main_grads) ctx->saved_data["main_grads"] = main_grads_value(main_grads);
    if (has_branch) return {f.sum, f.normed};
    return {f.normed};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const bool has_branch = ctx->saved_data["has_branch"].toBool(), has_bias = ctx->saved_data["has_bias"].toBool();
    const NormSaved kept{saved[0], saved[3], saved[4]};
    const NormPrologue norm{norm_options_of(ctx->saved_data["rms"].toBool(), 0.0,
                                       ctx->saved_data["zero_centered_gamma"].toBool(), saved[1].size(0)),
                            saved[1], saved[2]};
    const auto& d_sum = has_branch ? grads[0] : torch::Tensor();
    const auto& d_normed = grads[has_branch ? 1 : 0];
    const torch::Tensor& branch_bias = saved[5];
    NormGradRequest request;
    request.gamma = ctx->needs_input_grad(2);
    request.beta = has_bias && ctx->needs_input_grad(3);
    if (ctx->saved_data.count("main_grads")) request.main_grads = main_grads_of(ctx->saved_data["main_grads"]);
    request.branch_bias = bias_grad_target(branch_bias, ctx->needs_input_grad(4), request.main_grads);
    auto b = norm_prologue_backward(norm, kept, d_normed, d_sum, request, /*rewrite_normed=*/false);
    // residual and branch take the same gradient (an add passes it on to both).
    return {b.d_in,
            has_branch ? b.d_in : torch::Tensor(),
            b.d_weight,
            has_bias ? b.d_bias : torch::Tensor(),
            bias_grad_for_autograd(branch_bias, request.branch_bias),
            torch::Tensor(),
            torch::Tensor(),
            torch::Tensor(),
            torch::Tensor(),
            torch::Tensor(),
            torch::Tensor(),
            torch::Tensor()};
  }
};

bool same_kind(const torch::Tensor& a, const torch::Tensor& b) {
  return a.scalar_type() == b.scalar_type() && a.device() == b.device();
}

// The fp32 sum over tokens of g [..., n] into the bias gradient's target.
void sum_into(const BiasGradTarget& target, const torch::Tensor& g) {
  const auto total = g.reshape({-1, g.size(-1)}).sum(0, false, torch::kFloat32);
  if (target.accumulate) target.grad.add_(total);
  else target.grad.copy_(total);
}

// branch + bias with the bias's gradient summed in fp32 into bias_grad_target (the unfused
// counterpart of the norms' folded add).
struct BranchBiasFunction : torch::autograd::Function<BranchBiasFunction> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& branch, const torch::Tensor& bias,
                               const MainGradsPtr& main_grads) {
    ctx->save_for_backward({bias});
    if (main_grads) ctx->saved_data["main_grads"] = main_grads_value(main_grads);
    return branch + bias;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const torch::Tensor bias = ctx->get_saved_variables()[0];
    const torch::Tensor& g = grads[0];
    const MainGradsPtr main_grads =
        ctx->saved_data.count("main_grads") ? main_grads_of(ctx->saved_data["main_grads"]) : MainGradsPtr();
    const auto target = bias_grad_target(bias, g.defined() && ctx->needs_input_grad(1), main_grads);
    if (!target.grad.defined()) return {g, torch::Tensor(), torch::Tensor()};
    sum_into(target, g);
    return {g, bias_grad_for_autograd(bias, target), torch::Tensor()};
  }
};

// branch + bias (undefined: branch itself); on a GPU the bias's gradient as the kernels sum it.
torch::Tensor add_branch_bias(const torch::Tensor& branch, const torch::Tensor& bias, const MainGradsPtr& main_grads) {
  if (!bias.defined()) return branch;
  if (!branch.is_cuda()) return branch + bias;
  return BranchBiasFunction::apply(branch, bias, main_grads);
}

}  // namespace

torch::Tensor ResidualStream::sum(const MainGradsPtr& main_grads) const {
  return branch.defined() ? residual + add_branch_bias(branch, branch_bias, main_grads) : residual;
}

NormOptions norm_options_of(bool rms, double epsilon, bool zero_centered_gamma, int64_t size) {
  NormOptions o;
  o.size = size;
  o.kind = rms ? Normalization::RMSNorm : Normalization::LayerNorm;
  o.epsilon = epsilon;
  o.zero_centered_gamma = zero_centered_gamma;
  return o;
}

bool norm_prologue_applies(const torch::Tensor& residual, const torch::Tensor& branch, const NormPrologue& norm,
                           const torch::Tensor& branch_bias) {
  const NormOptions& o = norm.options;
  if (!residual.is_cuda() || !kernel_float_of(residual) || residual.dim() == 0) return false;
  if (o.size < 1 || o.size > kernels::kResidualNormMaxHidden || residual.size(-1) != o.size) return false;
  if (branch.defined() && !(same_kind(branch, residual) && branch.sizes() == residual.sizes())) return false;
  if (branch_bias.defined() &&
      !(branch.defined() && same_kind(branch_bias, residual) && branch_bias.dim() == 1 && branch_bias.size(0) == o.size))
    return false;
  const auto& weight = norm.weight;
  if (!same_kind(weight, residual) || weight.dim() != 1 || weight.size(0) != o.size) return false;
  const auto& bias = norm.bias;
  const bool uses_bias = o.kind == Normalization::LayerNorm && bias.defined();
  return !uses_bias || (same_kind(bias, residual) && bias.dim() == 1 && bias.size(0) == o.size);
}

NormPrologueForward norm_prologue_forward(const torch::Tensor& residual, const torch::Tensor& branch,
                                          const NormPrologue& norm, const torch::Tensor& branch_bias) {
  const c10::cuda::CUDAGuard device(residual.device());
  const bool rms = norm.options.kind == Normalization::RMSNorm;
  const auto x = residual.contiguous();
  const auto b = branch.defined() ? branch.contiguous() : torch::Tensor();
  const auto gamma = norm.weight.contiguous();
  const auto beta = !rms && norm.bias.defined() ? norm.bias.contiguous() : torch::Tensor();
  const auto s = shape_of(x, rms, norm.options.epsilon, norm.options.zero_centered_gamma);
  NormPrologueForward f;
  f.normed = torch::empty_like(x);
  f.sum = b.defined() ? torch::empty_like(x) : x;
  const auto stats = x.options().dtype(torch::kFloat32);
  auto mean = rms ? torch::Tensor() : torch::empty({s.rows}, stats);
  auto rstd = torch::empty({s.rows}, stats);
  const auto pending_bias = b.defined() && branch_bias.defined() ? branch_bias.contiguous() : torch::Tensor();
  kernels::ResidualNormForwardIo io;
  io.residual = x.data_ptr();
  io.branch = data_or_null(b);
  io.branch_bias = data_or_null(pending_bias);
  io.gamma = gamma.data_ptr();
  io.beta = data_or_null(beta);
  io.sum = b.defined() ? f.sum.data_ptr() : nullptr;
  io.normed = f.normed.data_ptr();
  io.mean = mean.defined() ? mean.data_ptr<float>() : nullptr;
  io.rstd = rstd.data_ptr<float>();
  kernels::residual_norm_forward(s, io, kernel_stream_of(x));
  f.saved = {f.sum, mean, rstd};
  return f;
}

NormPrologueBackward norm_prologue_backward(const NormPrologue& norm, const NormSaved& saved, const torch::Tensor& d_normed_in,
                                            const torch::Tensor& d_sum_in, const NormGradRequest& request,
                                            bool rewrite_normed) {
  const BiasGradTarget& branch_bias_grad = request.branch_bias;
  const auto& sum = saved.sum;
  const c10::cuda::CUDAGuard device(sum.device());
  // The gradient of a sum arrives expanded (stride 0), of a cast in another dtype.
  auto as_rows = [&](const torch::Tensor& g) { return g.defined() ? g.to(sum.scalar_type()).contiguous() : g; };
  const auto d_sum = as_rows(d_sum_in), d_normed = as_rows(d_normed_in);
  NormPrologueBackward out;
  const bool branch_bias = branch_bias_grad.grad.defined();
  if (!d_normed.defined() && !rewrite_normed) {
    out.d_in = d_sum;  // the norm's output was not used: no norm gradients
    if (branch_bias) sum_into(branch_bias_grad, d_sum.defined() ? d_sum : torch::zeros_like(sum));
    return out;
  }
  const bool rms = norm.options.kind == Normalization::RMSNorm;
  const auto s = shape_of(sum, rms, 0.0, norm.options.zero_centered_gamma);
  const auto gamma = norm.weight.contiguous();
  const auto beta = !rms && norm.bias.defined() ? norm.bias.contiguous() : torch::Tensor();
  // A norm whose output was not used (no d_normed) still rewrites it: its gradient is zero.
  const auto dy = d_normed.defined() ? d_normed : torch::zeros_like(sum);
  out.d_in = torch::empty_like(sum);
  kernels::ResidualNormBackwardIo io;
  io.d_normed = dy.data_ptr();
  io.d_sum = data_or_null(d_sum);
  io.sum = sum.data_ptr();
  io.gamma = gamma.data_ptr();
  io.beta = data_or_null(beta);
  io.mean = saved.mean.defined() ? saved.mean.data_ptr<float>() : nullptr;
  io.rstd = saved.rstd.data_ptr<float>();
  io.d_in = out.d_in.data_ptr();
  const MainGradsPtr main_grads = request.into_main_grads ? request.main_grads : MainGradsPtr();
  io.d_gamma = norm_param_grad_out(norm.weight, request.gamma, main_grads, out.d_weight);
  io.d_beta = norm_param_grad_out(beta.defined() ? norm.bias : torch::Tensor(), request.beta, main_grads, out.d_bias);
  if (branch_bias) {
    TORCH_CHECK(branch_bias_grad.grad.scalar_type() == torch::kFloat32 && branch_bias_grad.grad.is_contiguous() &&
                    branch_bias_grad.grad.numel() == s.hidden,
                "the branch bias's gradient must be fp32 [hidden]");
    io.d_branch_bias = {branch_bias_grad.grad.data_ptr(), true, branch_bias_grad.accumulate};
  }
  torch::Tensor workspace;
  if (io.d_gamma.data || io.d_beta.data || branch_bias) {
    io.workspace_rows = kernels::residual_norm_workspace_rows(s);
    // Gamma's and beta's partial rows, then the branch bias's (the kernels' layout).
    workspace = torch::empty({(branch_bias ? 3 : 2) * io.workspace_rows, s.hidden}, sum.options().dtype(torch::kFloat32));
    io.workspace = workspace.data_ptr<float>();
  }
  if (rewrite_normed) {
    out.normed = torch::empty_like(sum);
    io.normed = out.normed.data_ptr();
  }
  kernels::residual_norm_backward(s, io, kernel_stream_of(sum));
  return out;
}

fp8::NormBackwardGrads fp8_norm_backward(const fp8::NormBackwardInputs& in) {
  NormPrologue norm;
  norm.options.size = in.input.size(-1);
  norm.options.kind = in.mean.defined() ? Normalization::LayerNorm : Normalization::RMSNorm;
  norm.weight = in.gamma;
  norm.bias = in.beta;
  const int64_t rows = in.input.dim() == 2 ? in.input.size(0) : -1;
  const auto stats = [rows](const torch::Tensor& t) {
    return !t.defined() || (t.scalar_type() == torch::kFloat32 && t.is_contiguous() && t.numel() == rows);
  };
  const bool applies = norm_prologue_applies(in.input, torch::Tensor(), norm) && in.input.is_contiguous() &&
                       in.rstd.defined() && stats(in.rstd) && stats(in.mean) &&
                       in.d_normed.scalar_type() == in.input.scalar_type() && in.d_normed.sizes() == in.input.sizes();
  if (!applies) return fp8::torch_norm_backward(in);
  // The FP8 norm-linear returns them to autograd (its gamma may be gamma + 1, no parameter).
  NormGradRequest request;
  request.gamma = in.want_dgamma;
  request.beta = in.want_dbeta;
  request.into_main_grads = false;
  const auto b = norm_prologue_backward(norm, NormSaved{in.input, in.mean, in.rstd}, in.d_normed, torch::Tensor(),
                                        request, /*rewrite_normed=*/false);
  return {b.d_in, b.d_weight, b.d_bias};
}

ResidualNormOutput unfused_residual_add_norm(const torch::Tensor& residual, const torch::Tensor& branch,
                                             const NormOptions& options, const torch::Tensor& weight,
                                             const torch::Tensor& bias, const torch::Tensor& branch_bias,
                                             const MainGradsPtr& main_grads) {
  auto sum = ResidualStream{residual, branch, branch_bias}.sum(main_grads);
  return {sum, torch_norm(sum, options, weight, bias)};
}

ResidualNormOutput residual_add_norm(const torch::Tensor& residual, const torch::Tensor& branch, const NormOptions& options,
                                     const torch::Tensor& weight, const torch::Tensor& bias,
                                     const torch::Tensor& branch_bias, const MainGradsPtr& main_grads) {
  if (!norm_prologue_applies(residual, branch, NormPrologue{options, weight, bias}, branch_bias))
    return unfused_residual_add_norm(residual, branch, options, weight, bias, branch_bias, main_grads);
  const bool rms = options.kind == Normalization::RMSNorm;
  const bool has_bias = !rms && bias.defined();
  const auto none = torch::empty({0}, residual.options());
  const auto out = ResidualNormFunction::apply(residual, branch.defined() ? branch : none, weight, has_bias ? bias : none,
                                               branch_bias.defined() ? branch_bias : none, branch.defined(), has_bias,
                                               branch_bias.defined(), rms, options.epsilon, options.zero_centered_gamma,
                                               main_grads);
  if (!branch.defined()) return {residual, out[0]};
  return {out[0], out[1]};
}

torch::Tensor apply_norm(const torch::Tensor& x, const NormOptions& options, const torch::Tensor& weight,
                         const torch::Tensor& bias, const MainGradsPtr& main_grads) {
  return residual_add_norm(x, torch::Tensor(), options, weight, bias, torch::Tensor(), main_grads).normed;
}

}  // namespace fp8tron
