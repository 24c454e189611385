#include "optim/fused_adamw.h"

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "core/error.h"
#include "optim/adamw_kernels.h"

namespace fp8tron {
namespace {

bool on_device_fp32(const torch::Tensor& t, const torch::Device& device) {
  return t.defined() && t.device() == device && t.scalar_type() == torch::kFloat32 && t.is_contiguous();
}

bool scalar_on(const torch::Tensor& t, const torch::Device& device) { return on_device_fp32(t, device) && t.numel() == 1; }

}  // namespace

std::optional<kernels::ModelCopyType> copy_type_of(const torch::Tensor& t) {
  if (!t.defined()) return kernels::ModelCopyType::kNone;
  switch (t.scalar_type()) {
    case torch::kBFloat16: return kernels::ModelCopyType::kBFloat16;
    case torch::kFloat16: return kernels::ModelCopyType::kFloat16;
    case torch::kFloat32: return kernels::ModelCopyType::kFloat32;
    default: return std::nullopt;
  }
}

bool fused_adamw_applies(const AdamWState& s, const torch::Tensor& step, const torch::Tensor& found_inf,
                         const std::optional<torch::Tensor>& grad_divisor) {
  if (!s.param.defined() || !s.param.is_cuda()) return false;
  const torch::Device device = s.param.device();
  const int64_t n = s.param.numel();
  for (const auto* t : {&s.param, &s.grad})
    if (!on_device_fp32(*t, device) || t->numel() != n) return false;
  const auto moment_dtype = s.exp_avg.defined() ? s.exp_avg.scalar_type() : torch::kFloat32;
  if (moment_dtype != torch::kFloat32 && moment_dtype != torch::kBFloat16) return false;
  for (const auto* t : {&s.exp_avg, &s.exp_avg_sq})
    if (!t->defined() || t->device() != device || t->scalar_type() != moment_dtype || !t->is_contiguous() || t->numel() != n)
      return false;
  if (s.model_copy.defined() &&
      (s.model_copy.device() != device || !s.model_copy.is_contiguous() || s.model_copy.numel() != n || !copy_type_of(s.model_copy)))
    return false;
  return scalar_on(step, device) && scalar_on(found_inf, device) && (!grad_divisor || scalar_on(*grad_divisor, device));
}

void fused_adamw(const AdamWState& s, const torch::Tensor& step, const torch::Tensor& found_inf,
                 const std::optional<torch::Tensor>& grad_divisor, const AdamWHyper& hyper) {
  FP8TRON_CHECK(fused_adamw_applies(s, step, found_inf, grad_divisor), "fused_adamw: unsupported tensors");
  const c10::cuda::CUDAGuard guard(s.param.device());
  const kernels::AdamWSegment segment{s.param.data_ptr<float>(),
                                      s.grad.data_ptr<float>(),
                                      s.exp_avg.data_ptr(),
                                      s.exp_avg_sq.data_ptr(),
                                      s.exp_avg.scalar_type() == torch::kBFloat16 ? kernels::MomentType::kBFloat16
                                                                                 : kernels::MomentType::kFloat32,
                                      s.model_copy.defined() ? s.model_copy.data_ptr() : nullptr,
                                      *copy_type_of(s.model_copy),
                                      s.param.numel()};
  const kernels::AdamWDeviceScalars scalars{step.data_ptr<float>(), found_inf.data_ptr<float>(),
                                            grad_divisor ? grad_divisor->data_ptr<float>() : nullptr};
  const kernels::AdamWHyperParams h{hyper.lr, hyper.beta1, hyper.beta2, hyper.eps, hyper.weight_decay};
  kernels::fused_adamw(segment, scalars, h, c10::cuda::getCurrentCUDAStream(s.param.device().index()).stream());
}

}  // namespace fp8tron
