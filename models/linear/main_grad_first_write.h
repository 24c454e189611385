// The first wgrad GEMM of a step writes the fp32 main gradient instead of adding to a zeroed one.
//
// Under gradient-accumulation fusion (models/linear/fused_linear.h) Megatron zeroes every main gradient
// before a step and every wgrad GEMM adds into it (beta = 1). For the bf16 linears whose weight
// and bias gradients only their own GEMMs write, the step's first GEMM can write them (beta = 0)
// and later micro-batches add: no zeroing pass over those 95% of the buffer, and no read of the
// zeros by the first GEMM. The result is the same bit for bit (0 + x = x). The FP8 linears do the
// same through their sites (fp8/fp8_linear.h).
//
// Process-wide, like the fusion's switch (fp8/wgrad_fusion.h): the trainer registers the
// parameters once (and takes them out of the optimizer's zeroing), starts each step with
// new_step() where it zeroes the rest, and before the gradients are reduced zeroes any registered
// gradient the step did not write (zero_unwritten), so a weight that got no gradient still reads 0.
#pragma once
#include <torch/torch.h>

#include <cstdint>
#include <vector>

namespace fp8tron::main_grad_first_write {

// The parameters whose main gradients (fp32 `.grad` views) the wgrad GEMMs write; replaces any
// earlier set. Empty: none (every GEMM adds).
void own(const std::vector<torch::Tensor>& params);
// The gradients count as zeroed: each registered one's next GEMM writes.
void new_step();
// Whether `param` is registered and its main gradient not yet written since new_step(); marks it
// written. The GEMM about to produce its gradient then writes instead of adding.
bool take(const torch::Tensor& param);
// Zeroes the registered main gradients that no GEMM wrote since new_step(). Called again without a
// new_step() (a CUDA graph replaying the step whose first writes it captured: no host call marks
// them), it zeroes again those it zeroed the first time, as the replayed step did not write them.
void zero_unwritten();
// How many first writes take() has granted in this process (tests check the path runs).
uint64_t granted();
// Off: the trainer registers nothing and zeroes every gradient (tests compare the two). Read when
// the trainer is built.
void set_enabled(bool on);
bool enabled();

}  // namespace fp8tron::main_grad_first_write
