#include "models/fused_linear.h"

#include <c10/cuda/CUDAStream.h>

#include "fp8/gemm.h"
#include "fp8/grouped_gemm.h"
#include "fp8/wgrad_fusion.h"

namespace fp8tron {
namespace {
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

bool is_main_grad(const torch::Tensor& weight) {
  const torch::Tensor g = weight.grad();
  return g.defined() && g.scalar_type() == torch::kFloat32 && g.is_contiguous() && g.sizes() == weight.sizes();
}

// dW [out, in] += dY^T X in fp32 into the main gradient and, through the same GEMM call (cuBLASLt's
// BGRADB epilogue: the sum of dY over tokens), the bias gradient in fp32. On Hopper cuBLASLt runs the
// sum as a second kernel, still faster than torch's reduction (1.43 vs 2.0 ms per GPT-2 124M step on
// an H100). The device's shared heuristic-choice handle: the same kernels in every run, as at::addmm.
torch::Tensor wgrad_and_bias_grad(const torch::Tensor& dy_in, const torch::Tensor& x_in, torch::Tensor& main_grad) {
  const auto dy = dy_in.contiguous(), x = x_in.contiguous();
  const int64_t tokens = x.size(0), in = x.size(1), out = dy.size(1);
  auto bias_grad = torch::empty({out}, dy.options().dtype(torch::kFloat32));
  // Column-major (gemm.h): D = main_grad as in x out, op(A) = X as in x tokens, op(B) = dY^T as tokens x out.
  const fp8::GemmOperand a{x.data_ptr(), fp8::DType::kBF16, in, tokens, in, false};
  const fp8::GemmOperand b{dy.data_ptr(), fp8::DType::kBF16, out, tokens, out, true};
  const fp8::GemmOutput d{main_grad.data_ptr(), fp8::DType::kFP32, in};
  fp8::GemmConfig config;
  config.accumulate = true;
  config.bias = bias_grad.data_ptr();
  config.bias_dtype = fp8::DType::kFP32;
  config.bias_gradient = true;
  fp8::gemm(fp8::grouped_gemm_resources().handle, a, b, d, config,
            c10::cuda::getCurrentCUDAStream(x.device().index()).stream());
  return bias_grad;
}

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
    if (kBias && ctx->needs_input_grad(1) && ctx->needs_input_grad(2) && is_main_grad(weight) && is_main_grad(saved[2]) &&
        x.scalar_type() == torch::kBFloat16) {
      // Both gradients from one GEMM, both accumulated into their fp32 main gradients.
      torch::Tensor main_grad = weight.grad(), bias_main_grad = saved[2].grad();
      bias_main_grad.add_(wgrad_and_bias_grad(dy, x.reshape({-1, in}), main_grad));
      return result;
    }
    if (ctx->needs_input_grad(1)) {
      const auto x2d = x.reshape({-1, in});
      if (is_main_grad(weight)) {
        // dW [out, in] = dY^T [out, M] x X [M, in], accumulated in fp32 into the main gradient.
        torch::Tensor main_grad = weight.grad();
        at::addmm_out(main_grad, main_grad, dy.t(), x2d, torch::kFloat32);
      } else {
        result[1] = at::mm(dy.t(), x2d);
      }
    }
    if (kBias && ctx->needs_input_grad(2)) result[2] = dy.sum(0);
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
