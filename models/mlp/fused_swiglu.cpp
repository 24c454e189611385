#include "models/mlp/fused_swiglu.h"

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <optional>

#include "core/error.h"
#include "fp8/swiglu_backward.h"
#include "models/kernel_float_of.h"
#include "models/kernel_stream_of.h"
#include "models/linear/fused_linear.h"
#include "models/linear/linear_grads.h"
#include "models/mlp/swiglu_kernels.h"

namespace fp8tron {
namespace {
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;


// The kernels take contiguous [rows, 2f] / [rows, f] buffers; rows are all leading dimensions.

// Both halves of x's gradient from dy alone (x a CUDA tensor of a kernel dtype).
torch::Tensor swiglu_backward_kernel(const torch::Tensor& grad, const torch::Tensor& x_in) {
  const auto x = x_in.contiguous();
  const c10::cuda::CUDAGuard device(x.device());
  // The gradient of a sum arrives expanded (stride 0), of a cast in another dtype.
  auto dy = grad.to(x.scalar_type()).contiguous();
  const int64_t f = x.size(-1) / 2, rows = f == 0 ? 0 : x.numel() / (2 * f);
  auto dx = torch::empty_like(x);
  kernels::swiglu_backward(dy.data_ptr(), x.data_ptr(), dx.data_ptr(), *kernel_float_of(x), rows, f, kernel_stream_of(x));
  return dx;
}

struct FusedSwiglu : torch::autograd::Function<FusedSwiglu> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x_in) {
    const c10::cuda::CUDAGuard device(x_in.device());
    auto x = x_in.contiguous();
    const int64_t f = x.size(-1) / 2, rows = f == 0 ? 0 : x.numel() / (2 * f);
    auto out_shape = x.sizes().vec();
    out_shape.back() = f;
    auto y = torch::empty(out_shape, x.options());
    kernels::swiglu_forward(x.data_ptr(), y.data_ptr(), *kernel_float_of(x), rows, f, kernel_stream_of(x));
    ctx->save_for_backward({x});  // x alone: backward recomputes silu(gate)
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    return {swiglu_backward_kernel(grad[0], ctx->get_saved_variables()[0])};
  }
};

// y = swiglu(x), z = y W^T (+ b), saving x alone: the backward's SwiGLU pass writes y again
// for W's gradient. Autograd functions take no undefined inputs: with and without a bias.
template <bool kBias>
struct SwigluLinear : torch::autograd::Function<SwigluLinear<kBias>> {
  static torch::Tensor run(AutogradContext* ctx, const torch::Tensor& x_in, const torch::Tensor& weight,
                           const torch::Tensor& bias, const MainGradsPtr& main_grads) {
    ctx->saved_data["main_grads"] = main_grads_value(main_grads);
    const c10::cuda::CUDAGuard device(x_in.device());
    const auto x = x_in.contiguous();
    const int64_t f = weight.size(1), rows = x.numel() / (2 * f);
    auto y = torch::empty({rows, f}, x.options());
    kernels::swiglu_forward(x.data_ptr(), y.data_ptr(), *kernel_float_of(x), rows, f, kernel_stream_of(x));
    if (kBias) ctx->save_for_backward({x, weight, bias});
    else ctx->save_for_backward({x, weight});
    auto sizes = x.sizes().vec();
    sizes.back() = weight.size(0);
    return at::linear(y, weight, bias).view(sizes);
  }
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& weight,
                               const MainGradsPtr& main_grads) {
    return run(ctx, x, weight, torch::Tensor(), main_grads);
  }
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& weight,
                               const torch::Tensor& bias, const MainGradsPtr& main_grads) {
    return run(ctx, x, weight, bias, main_grads);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor &x = saved[0], &weight = saved[1];
    const torch::Tensor bias = kBias ? saved[2] : torch::Tensor();
    const c10::cuda::CUDAGuard device(x.device());
    const int64_t out = weight.size(0), f = weight.size(1), rows = x.numel() / (2 * f);
    const auto dz = grads[0].reshape({-1, out}).to(x.scalar_type()).contiguous();
    const auto dy = at::mm(dz, weight);  // [rows, f]
    auto dx = torch::empty_like(x);
    auto y = torch::empty({rows, f}, x.options());
    kernels::swiglu_backward(dy.data_ptr(), x.data_ptr(), dx.data_ptr(), *kernel_float_of(x), rows, f, kernel_stream_of(x),
                             y.data_ptr());
    const auto left = linear_param_grads(dz, y, weight, bias, ctx->needs_input_grad(1), kBias && ctx->needs_input_grad(2),
                                         main_grads_of(ctx->saved_data["main_grads"]));
    variable_list result(kBias ? 4 : 3);
    result[0] = dx;
    result[1] = left.weight;
    if (kBias) result[2] = left.bias;
    return result;
  }
};

}  // namespace

torch::Tensor unfused_swiglu(const torch::Tensor& x) {
  auto halves = x.chunk(2, -1);
  return at::silu(halves[0]) * halves[1];
}

torch::Tensor fused_swiglu(const torch::Tensor& x) {
  FP8TRON_CHECK(x.dim() >= 1 && x.size(-1) % 2 == 0,
                "SwiGLU input of last dimension " + std::to_string(x.dim() ? x.size(-1) : 0) +
                    ": [gate | up] needs an even size");
  if (!x.is_cuda() || !kernel_float_of(x)) return unfused_swiglu(x);
  return FusedSwiglu::apply(x);
}

torch::Tensor fused_swiglu_backward(const torch::Tensor& grad, const torch::Tensor& x) {
  FP8TRON_CHECK(x.dim() >= 1 && x.size(-1) % 2 == 0 && grad.numel() * 2 == x.numel(),
                "SwiGLU backward: the gradient must have half the elements of [gate | up]");
  if (!x.is_cuda() || !kernel_float_of(x)) return fp8::torch_swiglu_backward(grad, x);
  return swiglu_backward_kernel(grad, x);
}

torch::Tensor swiglu_linear(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias,
                            const MainGradsPtr& main_grads) {
  FP8TRON_CHECK(weight.dim() == 2 && x.dim() >= 1 && x.size(-1) == 2 * weight.size(1),
                "SwiGLU then linear: the input's last dimension is not twice the weight's input features");
  if (!x.is_cuda() || !kernel_float_of(x) || !main_grads || !grad_accumulation_fusion_applies(x, weight, *main_grads) ||
      main_grads->delays_wgrad_of(weight))
    return linear_with_grad_accumulation_fusion(fused_swiglu(x), weight, bias, main_grads);
  return bias.defined() ? SwigluLinear<true>::apply(x, weight, bias, main_grads)
                        : SwigluLinear<false>::apply(x, weight, main_grads);
}

}  // namespace fp8tron
