#include "models/linear/wgrad_deferral.h"

#include "fp8/held_wgrad.h"
#include "models/linear/fused_linear.h"
#include "models/linear/linear_grads.h"

namespace fp8tron {
namespace {
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// dW = dy^T x added into `weight`'s gradient: by the GEMM into its fp32 main gradient where
// gradient-accumulation fusion applies, else as autograd's linear computes it, added as
// AccumulateGrad adds it.
void add_weight_grad(const torch::Tensor& weight, const torch::Tensor& x, const torch::Tensor& dy,
                     const MainGradsPtr& main_grads) {
  torch::NoGradGuard no_grad;
  if (main_grads && grad_accumulation_fusion_applies(x, weight, *main_grads)) {
    linear_param_grads(dy, x, weight, {}, true, false, main_grads);
    return;
  }
  accumulate_param_grad(weight, at::mm(dy.t(), x));
}

// The node's state: the parameter whose gradient it adds to, the queue (null: at once), the
// model's main gradients. Kept here rather than as inputs (the weight may enter detached).
struct HeldWgradOf : torch::CustomClassHolder {
  HeldWgradOf(torch::Tensor w, std::shared_ptr<DeferredWork> q, MainGradsPtr g)
      : weight(std::move(w)), queue(std::move(q)), main_grads(std::move(g)) {}
  torch::Tensor weight;
  std::shared_ptr<DeferredWork> queue;
  MainGradsPtr main_grads;
};

// With and without a bias (autograd functions take no undefined tensors as inputs). `weight` is
// the GEMM operand: the parameter itself, or its values detached.
template <bool kBias>
struct HeldWgradLinear : torch::autograd::Function<HeldWgradLinear<kBias>> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& weight,
                               c10::intrusive_ptr<HeldWgradOf> state) {
    save(ctx, x, weight, std::move(state));
    return at::linear(x, weight.detach());
  }
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& weight,
                               const torch::Tensor& bias, c10::intrusive_ptr<HeldWgradOf> state) {
    save(ctx, x, weight, std::move(state));
    return at::linear(x, weight.detach(), bias.detach());
  }
  static void save(AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& weight,
                   c10::intrusive_ptr<HeldWgradOf> state) {
    ctx->save_for_backward({x, weight.detach()});
    ctx->saved_data["state"] = c10::IValue::make_capsule(std::move(state));
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const torch::Tensor &x = saved[0], &values = saved[1];
    const int64_t out = values.size(0), in = values.size(1);
    const auto dy = grads[0].reshape({-1, out});
    const auto x2d = x.reshape({-1, in});
    const auto state = c10::static_intrusive_pointer_cast<HeldWgradOf>(ctx->saved_data["state"].toCapsule());
    run_or_hold_wgrad(
        state->queue, [weight = state->weight, x2d, dy, g = state->main_grads] { add_weight_grad(weight, x2d, dy, g); },
        {state->weight});
    variable_list result(kBias ? 4 : 3);
    if (ctx->needs_input_grad(0)) result[0] = at::mm(dy, values).view(x.sizes());
    if (kBias && ctx->needs_input_grad(2)) result[2] = dy.sum(0);
    return result;
  }
};

torch::Tensor held_wgrad_linear(const torch::Tensor& x, const torch::Tensor& operand, const torch::Tensor& bias,
                                c10::intrusive_ptr<HeldWgradOf> state) {
  return bias.defined() ? HeldWgradLinear<true>::apply(x, operand, bias, std::move(state))
                        : HeldWgradLinear<false>::apply(x, operand, std::move(state));
}

}  // namespace

torch::Tensor linear_with_held_wgrad(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias,
                                     std::shared_ptr<DeferredWork> queue, const MainGradsPtr& main_grads) {
  return held_wgrad_linear(x, weight, bias, c10::make_intrusive<HeldWgradOf>(weight, std::move(queue), main_grads));
}

torch::Tensor WgradDeferral::linear(const torch::Tensor& x, const torch::Tensor& weight) {
  auto queue = defer_next() ? held_ : nullptr;
  return held_wgrad_linear(x, weight.detach(), {}, c10::make_intrusive<HeldWgradOf>(weight, std::move(queue), main_grads_));
}

void WgradDeferral::drain() {
  held_->run();
  calls_ = 0;
}

}  // namespace fp8tron
