#include "models/linear/norm_linear.h"

#include <optional>

#include "models/linear/fused_linear.h"
#include "models/linear/linear_grads.h"

namespace fp8tron {
namespace {
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

std::optional<torch::Tensor> optional(const torch::Tensor& t) {
  return t.defined() ? std::optional<torch::Tensor>(t) : std::nullopt;
}

// Inputs residual, branch, gamma, beta, weight, bias, branch_bias (the branch's pending bias);
// branch, beta, bias and branch_bias may be absent (no autograd inputs then: needs_input_grad
// counts the present ones only, the returned gradients every argument). Outputs {sum, y}, or {y}
// without a branch (the sum is residual).
struct NormLinearFunction : torch::autograd::Function<NormLinearFunction> {
  static variable_list forward(AutogradContext* ctx, const torch::Tensor& residual, const std::optional<torch::Tensor>& branch,
                               const torch::Tensor& gamma, const std::optional<torch::Tensor>& beta,
                               const torch::Tensor& weight, const std::optional<torch::Tensor>& bias,
                               const std::optional<torch::Tensor>& branch_bias, bool rms, double epsilon,
                               bool zero_centered_gamma, const MainGradsPtr& main_grads) {
    ctx->set_materialize_grads(false);  // an unused output's gradient stays undefined
    const NormPrologue norm{norm_options_of(rms, epsilon, zero_centered_gamma, gamma.size(0)), gamma,
                            beta.value_or(torch::Tensor())};
    const auto pending_bias = branch_bias.value_or(torch::Tensor());
    const auto f = norm_prologue_forward(residual, branch.value_or(torch::Tensor()), norm, pending_bias);
    auto y = at::linear(f.normed, weight, bias.value_or(torch::Tensor()));
    ctx->save_for_backward(
        {f.saved.sum, f.saved.mean, f.saved.rstd, gamma, norm.bias, weight, bias.value_or(torch::Tensor()), pending_bias});
    ctx->saved_data["has_branch"] = branch.has_value();
    ctx->saved_data["rms"] = rms;
    ctx->saved_data["zero_centered_gamma"] = zero_centered_gamma;
    ctx->saved_data["main_grads"] = main_grads_value(main_grads);
    if (branch.has_value()) return {f.sum, y};
    return {y};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const NormSaved kept{saved[0], saved[1], saved[2]};
    const torch::Tensor &gamma = saved[3], &beta = saved[4], &weight = saved[5], &bias = saved[6], &branch_bias = saved[7];
    const bool has_branch = ctx->saved_data["has_branch"].toBool();
    const NormPrologue norm{norm_options_of(ctx->saved_data["rms"].toBool(), 0.0,
                                       ctx->saved_data["zero_centered_gamma"].toBool(), gamma.size(0)),
                            gamma, beta};
    // needs_input_grad's indices: the present inputs in order.
    const int64_t gamma_edge = has_branch ? 2 : 1, weight_edge = gamma_edge + (beta.defined() ? 2 : 1);
    const bool want_weight = ctx->needs_input_grad(weight_edge);
    const bool want_bias = bias.defined() && ctx->needs_input_grad(weight_edge + 1);
    const int64_t branch_bias_edge = weight_edge + (bias.defined() ? 2 : 1);
    // (An absent input has no edge to ask about.)
    NormGradRequest request;
    request.main_grads = main_grads_of(ctx->saved_data["main_grads"]);
    request.branch_bias =
        bias_grad_target(branch_bias, branch_bias.defined() && ctx->needs_input_grad(branch_bias_edge), request.main_grads);

    const torch::Tensor d_sum = has_branch ? grads[0] : torch::Tensor();
    const torch::Tensor& dy_in = grads[has_branch ? 1 : 0];
    const int64_t out = weight.size(0), in = weight.size(1);
    const auto dy = dy_in.defined() ? dy_in.reshape({-1, out}) : dy_in;
    // dgrad, then the norm's pass (which rebuilds the GEMM's input), then the wgrad.
    const auto d_normed = dy.defined() ? at::mm(dy, weight).view(kept.sum.sizes()) : torch::Tensor();
    const bool rewrite = dy.defined() && (want_weight || want_bias);
    // Without dy the norm's output was not used: its parameters get no gradient.
    request.gamma = dy.defined() && ctx->needs_input_grad(gamma_edge);
    request.beta = dy.defined() && beta.defined() && ctx->needs_input_grad(gamma_edge + 1);
    const auto n = norm_prologue_backward(norm, kept, d_normed, d_sum, request, rewrite);
    LinearParamGrads linear;
    if (rewrite)
      linear = linear_param_grads(dy, n.normed.reshape({-1, in}), weight, bias, want_weight, want_bias, request.main_grads);
    return {n.d_in,
            has_branch ? n.d_in : torch::Tensor(),
            n.d_weight,
            n.d_bias,
            linear.weight,
            linear.bias,
            bias_grad_for_autograd(branch_bias, request.branch_bias),
            torch::Tensor(),
            torch::Tensor(),
            torch::Tensor(),
            torch::Tensor()};
  }
};

}  // namespace

bool norm_linear_applies(const ResidualStream& in, const NormPrologue& norm, const torch::Tensor& weight,
                         const MainGrads& main_grads) {
  return norm_prologue_applies(in.residual, in.branch, norm, in.branch_bias) &&
         grad_accumulation_fusion_applies(in.residual, weight, main_grads) && !main_grads.delays_wgrad_of(weight) &&
         weight.size(1) == norm.options.size;
}

ResidualOutput norm_linear(const ResidualStream& in, const NormPrologue& norm, const torch::Tensor& weight,
                           const torch::Tensor& bias, const MainGradsPtr& main_grads) {
  const bool rms = norm.options.kind == Normalization::RMSNorm;
  const auto beta = rms ? torch::Tensor() : norm.bias;
  const auto out =
      NormLinearFunction::apply(in.residual, optional(in.branch), norm.weight, optional(beta), weight, optional(bias),
                                optional(in.branch_bias), rms, norm.options.epsilon, norm.options.zero_centered_gamma,
                                main_grads);
  if (!in.branch.defined()) return {in.residual, out[0]};
  return {out[0], out[1]};
}

}  // namespace fp8tron
