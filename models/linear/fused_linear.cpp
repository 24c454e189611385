#include "models/linear/fused_linear.h"

#include "models/linear/linear_grads.h"
#include "models/linear/wgrad_deferral.h"

namespace fp8tron {
namespace {
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// With and without a bias (autograd functions take no undefined tensors as inputs).
template <bool kBias>
struct FusedLinear : torch::autograd::Function<FusedLinear<kBias>> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& weight,
                               const MainGradsPtr& main_grads) {
    ctx->save_for_backward({x, weight});
    ctx->saved_data["main_grads"] = main_grads_value(main_grads);
    return at::linear(x, weight);
  }
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& weight,
                               const torch::Tensor& bias, const MainGradsPtr& main_grads) {
    ctx->save_for_backward({x, weight, bias});
    ctx->saved_data["main_grads"] = main_grads_value(main_grads);
    return at::linear(x, weight, bias);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const torch::Tensor& x = saved[0];
    const torch::Tensor& weight = saved[1];
    const int64_t out = weight.size(0), in = weight.size(1);
    auto dy = grads[0].reshape({-1, out});
    variable_list result(kBias ? 4 : 3);
    if (ctx->needs_input_grad(0)) result[0] = at::mm(dy, weight).view(x.sizes());
    const torch::Tensor bias = kBias ? saved[2] : torch::Tensor();
    auto grads_left = linear_param_grads(dy, x.reshape({-1, in}), weight, bias, ctx->needs_input_grad(1),
                                         kBias && ctx->needs_input_grad(2), main_grads_of(ctx->saved_data["main_grads"]));
    result[1] = grads_left.weight;
    if (kBias) result[2] = grads_left.bias;
    return result;
  }
};

}  // namespace

bool grad_accumulation_fusion_applies(const torch::Tensor& x, const torch::Tensor& weight, const MainGrads& main_grads) {
  return x.is_cuda() && weight.requires_grad() && weight.dim() == 2 &&
         (weight.scalar_type() == torch::kBFloat16 || weight.scalar_type() == torch::kFloat16) &&
         x.scalar_type() == weight.scalar_type() && main_grads.fuses_into(weight);
}

torch::Tensor linear_with_grad_accumulation_fusion(const torch::Tensor& x, const torch::Tensor& weight,
                                                   const torch::Tensor& bias, const MainGradsPtr& main_grads) {
  if (!main_grads) return at::linear(x, weight, bias);
  if (auto queue = main_grads->wgrad_queue_for(weight)) return linear_with_held_wgrad(x, weight, bias, queue, main_grads);
  if (!grad_accumulation_fusion_applies(x, weight, *main_grads)) return at::linear(x, weight, bias);
  return bias.defined() ? FusedLinear<true>::apply(x, weight, bias, main_grads)
                        : FusedLinear<false>::apply(x, weight, main_grads);
}

}  // namespace fp8tron
