#include "models/linear/linear_grads.h"

#include <c10/cuda/CUDAStream.h>

#include "fp8/gemm.h"
#include "fp8/grouped_gemm.h"

namespace fp8tron {
namespace {

// dW [out, in] (+)= dY^T X in fp32 into the main gradient and, through the same GEMM call (cuBLASLt's
// BGRADB epilogue: the sum of dY over tokens), db in fp32: written straight into the bias's main
// gradient in a step's first write (models/linear/main_grads.h), else into a temporary that is
// added to it. On Hopper cuBLASLt runs the sum as a second kernel, still faster than torch's
// reduction (1.43 vs 2.0 ms per GPT-2 124M step on an H100). The device's shared heuristic-choice
// handle: the same kernels in every run, as at::addmm.
void wgrad_and_bias_grad(const torch::Tensor& dy_in, const torch::Tensor& x_in, torch::Tensor& main_grad,
                         bool overwrite_weight, torch::Tensor& bias_main_grad, bool overwrite_bias) {
  const auto dy = dy_in.contiguous(), x = x_in.contiguous();
  const int64_t tokens = x.size(0), in = x.size(1), out = dy.size(1);
  const auto bias_grad = overwrite_bias ? bias_main_grad : torch::empty({out}, dy.options().dtype(torch::kFloat32));
  // Column-major (gemm.h): D = main_grad as in x out, op(A) = X as in x tokens, op(B) = dY^T as tokens x out.
  const fp8::GemmOperand a{x.data_ptr(), fp8::DType::kBF16, in, tokens, in, false};
  const fp8::GemmOperand b{dy.data_ptr(), fp8::DType::kBF16, out, tokens, out, true};
  const fp8::GemmOutput d{main_grad.data_ptr(), fp8::DType::kFP32, in};
  fp8::GemmConfig config;
  config.accumulate = !overwrite_weight;
  config.bias = bias_grad.data_ptr();
  config.bias_dtype = fp8::DType::kFP32;
  config.bias_gradient = true;
  fp8::gemm(fp8::grouped_gemm_resources().handle, a, b, d, config,
            c10::cuda::getCurrentCUDAStream(x.device().index()).stream());
  if (!overwrite_bias) bias_main_grad.add_(bias_grad);
}

}  // namespace

bool is_main_grad(const torch::Tensor& param) {
  const torch::Tensor g = param.grad();
  return g.defined() && g.scalar_type() == torch::kFloat32 && g.is_contiguous() && g.sizes() == param.sizes();
}

LinearParamGrads linear_param_grads(const torch::Tensor& dy, const torch::Tensor& x, const torch::Tensor& weight,
                                    const torch::Tensor& bias, bool want_weight, bool want_bias,
                                    const MainGradsPtr& main_grads) {
  const auto first_write = [&](const torch::Tensor& param) { return main_grads && main_grads->take(param); };
  LinearParamGrads result;
  const bool has_bias = bias.defined() && want_bias;
  if (has_bias && want_weight && is_main_grad(weight) && is_main_grad(bias) && x.scalar_type() == torch::kBFloat16) {
    // Both gradients from one GEMM, both into their fp32 main gradients.
    torch::Tensor main_grad = weight.grad(), bias_main_grad = bias.grad();
    const bool overwrite_weight = first_write(weight);
    wgrad_and_bias_grad(dy, x, main_grad, overwrite_weight, bias_main_grad, first_write(bias));
    return result;
  }
  if (want_weight) {
    if (is_main_grad(weight)) {
      // dW [out, in] = dY^T [out, M] x X [M, in] in fp32 into the main gradient: written by a
      // step's first write (beta 0: the stale values are not read), else accumulated.
      torch::Tensor main_grad = weight.grad();
      const double beta = first_write(weight) ? 0.0 : 1.0;
      at::addmm_out(main_grad, main_grad, dy.t(), x, torch::kFloat32, beta);
    } else {
      result.weight = at::mm(dy.t(), x);
    }
  }
  if (has_bias) result.bias = dy.sum(0);
  return result;
}

BiasGradTarget bias_grad_target(const torch::Tensor& bias, bool wanted, const MainGradsPtr& main_grads) {
  if (!bias.defined() || !wanted) return {};
  if (main_grads) main_grads->allocate_before_write(bias);  // a deferred bias's, from a later part's pass
  if (!is_main_grad(bias)) return {torch::empty(bias.sizes(), bias.options().dtype(torch::kFloat32)), false, false};
  return {bias.grad(), !(main_grads && main_grads->take(bias)), true};
}

torch::Tensor bias_grad_for_autograd(const torch::Tensor& bias, const BiasGradTarget& target) {
  if (!bias.defined() || !target.grad.defined() || target.into_main_grad) return {};
  return target.grad.to(bias.scalar_type());
}

torch::Tensor into_main_grad_or_return(const torch::Tensor& param, const torch::Tensor& grad) {
  if (!is_main_grad(param)) return grad;
  torch::Tensor main_grad = param.grad();
  main_grad.add_(grad);
  return {};
}

}  // namespace fp8tron
