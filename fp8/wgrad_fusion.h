// Megatron's gradient-accumulation fusion (--no-gradient-accumulation-fusion turns it off): on a
// GPU, a linear whose weight gradient is an fp32 main-gradient buffer accumulates its wgrad GEMM
// straight into that buffer, and autograd gets no weight gradient. Off: the GEMM writes dW in the
// weight's dtype and autograd adds it into the buffer (a separate read-add-write).
//
// Process-wide, as in Megatron (one setting read by every linear, bf16, FP8 and grouped alike): the
// trainer sets it once, before the first step; it is a kernel choice, the math is the same up to the
// fp32 summation order.
#pragma once

namespace fp8tron {

bool gradient_accumulation_fusion();
void set_gradient_accumulation_fusion(bool on);

}  // namespace fp8tron
