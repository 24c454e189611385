#include "models/linear/wgrad_deferral.h"

#include "models/linear/fused_linear.h"
#include "models/linear/linear_grads.h"

namespace fp8tron {
namespace {
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The node's state: the deferral and the parameter whose gradient it adds to. The parameter is
// kept here, not as an input, so that autograd gives the node no edge to it.
struct DeferralOf : torch::CustomClassHolder {
  DeferralOf(std::shared_ptr<WgradDeferral> d, torch::Tensor w) : deferral(std::move(d)), weight(std::move(w)) {}
  std::shared_ptr<WgradDeferral> deferral;
  torch::Tensor weight;
};

struct DeferredWgradLinear : torch::autograd::Function<DeferredWgradLinear> {
  // `values`: the weight detached (the GEMM operand).
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& values, bool defer,
                               c10::intrusive_ptr<DeferralOf> state) {
    ctx->save_for_backward({x, values});
    ctx->saved_data["defer"] = defer;
    ctx->saved_data["state"] = c10::IValue::make_capsule(std::move(state));
    return at::linear(x, values);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const torch::Tensor &x = saved[0], &values = saved[1];
    const int64_t out = values.size(0), in = values.size(1);
    auto dy = grads[0].reshape({-1, out});
    auto x2d = x.reshape({-1, in});
    const auto state = c10::static_intrusive_pointer_cast<DeferralOf>(ctx->saved_data["state"].toCapsule());
    if (ctx->saved_data["defer"].toBool()) state->deferral->hold(x2d, dy);
    else state->deferral->accumulate(state->weight, x2d, dy);
    return {ctx->needs_input_grad(0) ? at::mm(dy, values).view(x.sizes()) : torch::Tensor(), torch::Tensor(),
            torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

void WgradDeferral::accumulate(const torch::Tensor& weight, const torch::Tensor& x, const torch::Tensor& dy) const {
  torch::NoGradGuard no_grad;
  // Into the fp32 main gradient by the GEMM itself where gradient-accumulation fusion applies;
  // else dW as autograd's linear computes it, added as AccumulateGrad adds it.
  if (main_grads_ && grad_accumulation_fusion_applies(x, weight, *main_grads_)) {
    linear_param_grads(dy, x, weight, {}, true, false, main_grads_);
    return;
  }
  const auto dw = at::mm(dy.t(), x);
  auto& grad = weight.mutable_grad();
  if (grad.defined()) grad.add_(dw);
  else grad = dw.to(weight.scalar_type());
}

void WgradDeferral::drain(const torch::Tensor& weight) {
  for (const auto& [x, dy] : held_) accumulate(weight, x, dy);
  held_.clear();
  calls_ = 0;
}

torch::Tensor linear_with_deferred_wgrad(const torch::Tensor& x, const torch::Tensor& weight,
                                         const std::shared_ptr<WgradDeferral>& deferral) {
  const bool defer = deferral->defer_next();
  return DeferredWgradLinear::apply(x, weight.detach(), defer, c10::make_intrusive<DeferralOf>(deferral, weight));
}

}  // namespace fp8tron
