#include "models/embedding/embedding.h"

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "models/embedding/embedding_grad_kernels.h"
#include "models/kernel_float_of.h"
#include "models/linear/linear_grads.h"

namespace fp8tron {
namespace {
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

bool into_main_grad_applies(const torch::Tensor& grad, const torch::Tensor& weight, const MainGrads& main_grads) {
  return grad.is_cuda() && main_grads.fuses_into(weight) && kernel_float_of(grad) && grad.scalar_type() == weight.scalar_type();
}

// The main gradient's rows of the looked-up tokens += their summed gradient rows.
void add_into_main_grad(const torch::Tensor& tokens, const torch::Tensor& grad_in, const torch::Tensor& weight,
                        MainGrads& main_grads) {
  const c10::cuda::CUDAGuard device(grad_in.device());
  torch::Tensor main_grad = weight.grad();
  // The step's first write: nothing has written this gradient yet, and its values are stale.
  if (main_grads.take(weight)) main_grad.zero_();
  const int64_t hidden = weight.size(1);
  const auto grad = grad_in.reshape({-1, hidden}).contiguous();
  const auto sorted = at::sort(tokens.reshape({-1}).to(torch::kLong), /*stable=*/true, /*dim=*/0, /*descending=*/false);
  kernels::EmbeddingGradShape s;
  s.lookups = grad.size(0);
  s.hidden = hidden;
  s.dtype = *kernel_float_of(grad);
  auto workspace = torch::empty({kernels::embedding_grad_workspace_floats(s)}, grad.options().dtype(torch::kFloat32));
  kernels::embedding_grad_into_main_grad(s, std::get<0>(sorted).data_ptr<int64_t>(), std::get<1>(sorted).data_ptr<int64_t>(),
                                         grad.data_ptr(), main_grad.data_ptr<float>(), workspace.data_ptr<float>(),
                                         c10::cuda::getCurrentCUDAStream(grad.device().index()).stream());
}

struct EmbeddingFunction : torch::autograd::Function<EmbeddingFunction> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& tokens, const torch::Tensor& weight,
                               const MainGradsPtr& main_grads) {
    ctx->save_for_backward({tokens, weight});
    ctx->saved_data["main_grads"] = main_grads_value(main_grads);
    return at::embedding(weight, tokens);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor &tokens = saved[0], &weight = saved[1], &grad = grads[0];
    const MainGradsPtr main_grads = main_grads_of(ctx->saved_data["main_grads"]);
    if (!grad.defined() || !ctx->needs_input_grad(1)) return {torch::Tensor(), torch::Tensor(), torch::Tensor()};
    if (!into_main_grad_applies(grad, weight, *main_grads))
      return {torch::Tensor(), at::embedding_backward(grad, tokens, weight.size(0), -1, false, false), torch::Tensor()};
    add_into_main_grad(tokens, grad, weight, *main_grads);
    return {torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor embedding_lookup(const torch::Tensor& tokens, const torch::Tensor& weight, const MainGradsPtr& main_grads) {
  if (!weight.is_cuda() || !weight.requires_grad() || !main_grads) return at::embedding(weight, tokens);
  return EmbeddingFunction::apply(tokens, weight, main_grads);
}

}  // namespace fp8tron
