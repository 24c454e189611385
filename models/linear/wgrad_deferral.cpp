#include "models/linear/wgrad_deferral.h"

#include "fp8/held_wgrad.h"
#include "models/linear/fused_linear.h"
#include "models/linear/linear_grads.h"

namespace fp8tron {
namespace {
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Whether the wgrad GEMM goes into the weight's fp32 main gradient (gradient-accumulation fusion):
// then, as in the fused linear, the bias's gradient comes from the same GEMM call.
bool fused(const torch::Tensor& weight, const torch::Tensor& x, const MainGradsPtr& main_grads) {
  return main_grads && grad_accumulation_fusion_applies(x, weight, *main_grads);
}

// dW = dy^T x (and db with `bias`, which only the fused path passes) added into the gradients: by
// the GEMM into the fp32 main gradients as the fused linear does, else as autograd's linear
// computes dW, added as AccumulateGrad adds it.
void add_param_grads(const torch::Tensor& weight, const torch::Tensor& bias, const torch::Tensor& x,
                     const torch::Tensor& dy, const MainGradsPtr& main_grads) {
  torch::NoGradGuard no_grad;
  if (fused(weight, x, main_grads)) {
    const auto left = linear_param_grads(dy, x, weight, bias, true, bias.defined(), main_grads);
    accumulate_param_grad(weight, left.weight);
    if (bias.defined()) accumulate_param_grad(bias, left.bias);
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
    ctx->saved_data["bias"] = bias;  // the parameter (the fused path adds its gradient)
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
    // The bias's gradient: from the wgrad GEMM where it is fused (held with it, as the fused
    // linear computes it), else at once as autograd's linear computes it.
    const bool want_bias = kBias && ctx->needs_input_grad(2);
    const bool bias_in_gemm = want_bias && fused(state->weight, x2d, state->main_grads);
    const torch::Tensor bias = bias_in_gemm ? ctx->saved_data["bias"].toTensor() : torch::Tensor();
    run_or_hold_wgrad(
        state->queue,
        [weight = state->weight, bias, x2d, dy, g = state->main_grads] { add_param_grads(weight, bias, x2d, dy, g); },
        {state->weight, kBias ? ctx->saved_data["bias"].toTensor() : torch::Tensor()});
    variable_list result(kBias ? 4 : 3);
    if (ctx->needs_input_grad(0)) result[0] = at::mm(dy, values).view(x.sizes());
    if (want_bias && !bias_in_gemm) result[2] = dy.sum(0);
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
