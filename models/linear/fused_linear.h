// y = x W^T (+ b) for bf16/fp16 linears on a GPU, with Megatron's gradient-accumulation fusion: the
// weight gradient is accumulated by the wgrad GEMM straight into the parameter's fp32 main gradient
// (the optimizer's flat buffer, which `.grad` views), in fp32, instead of being written in bf16 and
// added to the buffer by a separate read-add-write (AccumulateGrad's mixed-dtype add: 3.8 ms of a
// GPT-2 124M step and 10 ms of a 1.3B step on an H200). Autograd then gets no weight gradient, as
// in the FP8 path: AccumulateGrad has nothing to add and its hooks (the overlapped gradient
// reduction) still run.
//
// When the bias's gradient is such a buffer too (bf16), the same GEMM call produces the bias
// gradient (cuBLASLt's BGRADB epilogue sums dY over tokens) and it is added there in fp32; autograd
// gets no bias gradient either.
//
// Used when the weight's gradient is such a buffer (fp32, contiguous, the weight's shape); otherwise
// — and on the CPU, and with --no-gradient-accumulation-fusion — the ordinary linear runs. The
// forward is at::linear either way (cuBLASLt with the bias in its epilogue). A weight whose gradient
// is held (--delay-wgrad-compute, models/linear/main_grads.h) goes through
// models/linear/wgrad_deferral.h's linear instead, on every device.
#pragma once
#include <torch/torch.h>

#include "models/linear/main_grads.h"

namespace fp8tron {

// `main_grads`: the model's (models/linear/main_grads.h; null: the ordinary linear).
torch::Tensor linear_with_grad_accumulation_fusion(const torch::Tensor& x, const torch::Tensor& weight,
                                                   const torch::Tensor& bias, const MainGradsPtr& main_grads);

// Whether the fused linear applies to this weight (see above).
bool grad_accumulation_fusion_applies(const torch::Tensor& x, const torch::Tensor& weight, const MainGrads& main_grads);

}  // namespace fp8tron
