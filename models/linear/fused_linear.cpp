#include "models/linear/fused_linear.h"

#include "fp8/wgrad_fusion.h"
#include "models/linear/linear_grads.h"

namespace fp8tron {
namespace {
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// With and without a bias (autograd functions take no undefined tensors as inputs).
template <bool kBias>
struct FusedLinear : torch::autograd::Function<FusedLinear<kBias>> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& weight) {
    ctx->save_for_backward({x, weight});
    return at::linear(x, weight);
  }
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& weight,
                               const torch::Tensor& bias) {
    ctx->save_for_backward({x, weight, bias});
    return at::linear(x, weight, bias);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const torch::Tensor& x = saved[0];
    const torch::Tensor& weight = saved[1];
    const int64_t out = weight.size(0), in = weight.size(1);
    auto dy = grads[0].reshape({-1, out});
    variable_list result(kBias ? 3 : 2);
    if (ctx->needs_input_grad(0)) result[0] = at::mm(dy, weight).view(x.sizes());
    const torch::Tensor bias = kBias ? saved[2] : torch::Tensor();
    auto grads_left = linear_param_grads(dy, x.reshape({-1, in}), weight, bias, ctx->needs_input_grad(1),
                                         kBias && ctx->needs_input_grad(2));
    result[1] = grads_left.weight;
    if (kBias) result[2] = grads_left.bias;
    return result;
  }
};

}  // namespace

bool grad_accumulation_fusion_applies(const torch::Tensor& x, const torch::Tensor& weight) {
  return gradient_accumulation_fusion() && x.is_cuda() && weight.requires_grad() && weight.dim() == 2 &&
         (weight.scalar_type() == torch::kBFloat16 || weight.scalar_type() == torch::kFloat16) &&
         x.scalar_type() == weight.scalar_type() && is_main_grad(weight);
}

torch::Tensor linear_with_grad_accumulation_fusion(const torch::Tensor& x, const torch::Tensor& weight,
                                                   const torch::Tensor& bias) {
  if (!grad_accumulation_fusion_applies(x, weight)) return at::linear(x, weight, bias);
  return bias.defined() ? FusedLinear<true>::apply(x, weight, bias) : FusedLinear<false>::apply(x, weight);
}

}  // namespace fp8tron
