#include "trainer/mixed_precision_optimizer.h"

#include "core/error.h"

namespace fp8tron {
namespace {
// Megatron exempts biases and 1-D parameters (norm weights) from weight decay.
bool decays(const std::string& name, const torch::Tensor& p) {
  return p.dim() > 1 && name.find("bias") == std::string::npos;
}
torch::Dtype to_torch(ParamDtype d) {
  return d == ParamDtype::Bf16 ? torch::kBFloat16 : d == ParamDtype::Fp16 ? torch::kFloat16 : torch::kFloat32;
}
}  // namespace

MixedPrecisionOptimizer::MixedPrecisionOptimizer(const std::vector<std::pair<std::string, torch::Tensor>>& named_params,
                                                 const OptimizerConfig& optimizer, const PrecisionConfig& precision)
    : config_(optimizer), separate_main_weights_(precision.params_dtype != ParamDtype::Fp32) {
  FP8TRON_CHECK(!named_params.empty(), "no parameters");
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> ordered;
  for (bool decay_group : {true, false})
    for (const auto& [name, p] : named_params)
      if (decays(name, p) == decay_group) {
        ordered.push_back(p);
        numel_ += p.numel();
        if (decay_group) decay_numel_ += p.numel();
      }
  const auto device = ordered.front().device();
  const auto fp32 = torch::TensorOptions().device(device).dtype(torch::kFloat32);
  const auto param_dtype = to_torch(precision.params_dtype);

  main_params_ = torch::empty({numel_}, fp32);
  model_params_ = separate_main_weights_ ? torch::empty({numel_}, fp32.dtype(param_dtype)) : main_params_;
  main_grads_ = torch::zeros({numel_}, fp32.dtype(precision.grads_in_fp32 ? torch::kFloat32 : param_dtype));
  int64_t offset = 0;
  for (auto& p : ordered) {
    const int64_t n = p.numel();
    main_params_.narrow(0, offset, n).copy_(p.detach().reshape({-1}));  // fp32 values as initialised
    model_params_.narrow(0, offset, n).copy_(main_params_.narrow(0, offset, n));
    p.set_data(model_params_.narrow(0, offset, n).view(p.sizes()));
    // Gradients accumulate in place into the flat buffer. AccumulateGrad adds each new
    // (parameter-dtype) gradient into an existing .grad with `+=`, so an fp32 buffer under a
    // bf16 parameter accumulates micro-batches in fp32, as Megatron's main_grad does.
    p.mutable_grad() = main_grads_.narrow(0, offset, n).view(p.sizes());
    offset += n;
  }
  exp_avg_ = torch::zeros({numel_}, fp32);
  if (config_.optimizer == "adam") exp_avg_sq_ = torch::zeros({numel_}, fp32);
  for (auto& s : step_count_) s = torch::zeros({}, fp32);
  if (main_grads_.scalar_type() != torch::kFloat32) grads_fp32_ = torch::empty({numel_}, fp32);
}

void MixedPrecisionOptimizer::zero_grad() { main_grads_.zero_(); }

StepResult MixedPrecisionOptimizer::step(double lr, double weight_decay, double loss_scale) {
  torch::NoGradGuard no_grad;
  torch::Tensor grads = main_grads_;
  if (grads_fp32_.defined()) grads = grads_fp32_.copy_(main_grads_);
  if (loss_scale != 1.0) grads.mul_(1.0 / loss_scale);

  StepResult result;
  result.grad_norm = grads.norm(2);
  result.found_inf = result.grad_norm.isfinite().logical_not().to(torch::kFloat32);
  if (config_.clip_grad > 0) {
    // Megatron: clip_coeff = max_norm / (total_norm + 1e-6), applied when below 1.
    auto coeff = (config_.clip_grad / (result.grad_norm + 1e-6)).clamp_max(1.0);
    grads.mul_(torch::nan_to_num(coeff, 0.0, 0.0, 0.0));
  }

  const int64_t sizes[2] = {decay_numel_, numel_ - decay_numel_};
  const double group_wd[2] = {weight_decay, 0.0};
  int64_t offset = 0;
  for (int g = 0; g < 2; ++g) {
    const int64_t n = sizes[g];
    if (n == 0) continue;
    auto p = main_params_.narrow(0, offset, n), gr = grads.narrow(0, offset, n), m = exp_avg_.narrow(0, offset, n);
    if (config_.optimizer == "adam") {
      auto v = exp_avg_sq_.narrow(0, offset, n);
      step_count_[g].add_(1.0 - result.found_inf);  // a skipped step does not advance bias correction
      at::_fused_adamw_({p}, {gr}, {m}, {v}, {}, {step_count_[g]}, lr, config_.adam_beta1, config_.adam_beta2, group_wd[g],
                        config_.adam_eps, false, false, std::nullopt, result.found_inf);
    } else {
      // SGD with momentum (torch.optim.SGD semantics); skipped steps leave everything unchanged.
      auto keep = 1.0 - result.found_inf;
      auto d = torch::nan_to_num(gr, 0.0, 0.0, 0.0) + group_wd[g] * p;
      m.mul_(config_.sgd_momentum * keep + result.found_inf).add_(d * keep);
      p.sub_(m * (lr * keep));
    }
    offset += n;
  }
  if (separate_main_weights_) model_params_.copy_(main_params_);
  return result;
}

torch::Tensor MixedPrecisionOptimizer::params_norm() const { return main_params_.norm(2); }

}  // namespace fp8tron
