// The optimizer's own fused AdamW step on CUDA tensors (the kernel: optim/adamw_kernels.h),
// for one contiguous fp32 segment of the flat buffers, optionally writing the model's copy of the
// updated parameters (bf16, fp16 or fp32) in the same pass. p, m and v come out bitwise as
// at::_fused_adamw_ leaves them (adamw: maximize and amsgrad off); the gradient is read, never
// written.
#pragma once
#include <torch/torch.h>

#include <optional>

#include "optim/adamw_kernels.h"

namespace fp8tron {

struct AdamWState {
  torch::Tensor param, grad;           // fp32, contiguous, equal numel, one CUDA device
  torch::Tensor exp_avg, exp_avg_sq;   // likewise, both fp32 or both bf16 (stored rounded, math in fp32)
  torch::Tensor model_copy;  // undefined, or contiguous bf16 / fp16 / fp32 of param's numel: := param
};

struct AdamWHyper {
  double lr, beta1, beta2, eps, weight_decay;
};

// Whether fused_adamw takes these tensors (CUDA, fp32 (moments: both fp32 or both bf16), contiguous,
// one device; 0-dim fp32 device scalars); otherwise the caller uses at::_fused_adamw_ (on fp32
// copies of low-precision moments).
bool fused_adamw_applies(const AdamWState& s, const torch::Tensor& step, const torch::Tensor& found_inf,
                         const std::optional<torch::Tensor>& grad_divisor);

// The kernels' name for the element type of a model copy (kNone for an undefined tensor); nullopt
// for a type they do not write.
std::optional<kernels::ModelCopyType> copy_type_of(const torch::Tensor& t);

// `step`: the step count, already advanced; `found_inf` nonzero: nothing changes; `grad_divisor`:
// every gradient is divided by it as it is read. Never waits for the device.
void fused_adamw(const AdamWState& s, const torch::Tensor& step, const torch::Tensor& found_inf,
                 const std::optional<torch::Tensor>& grad_divisor, const AdamWHyper& hyper);

}  // namespace fp8tron
