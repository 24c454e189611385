// The fused AdamW step over one contiguous fp32 segment of the optimizer's flat buffers, torch-free:
// raw pointers, sizes and a stream (optim/optimizer_domain.cpp calls it per Adam segment).
//
// One pass reads p, g, m, v and writes p, m, v, and, when asked, the model's copy of p (bf16, fp16
// or fp32) rounded to nearest-even: 28 bytes per parameter plus 2 (bf16), where torch's
// _fused_adamw_ followed by the fp32 -> bf16 copy moves 34; 20 plus 2 with bf16 moments.
//
// The arithmetic is torch's _fused_adamw_ (ATen/native/cuda/fused_adam_utils.cuh, ADAMW mode,
// maximize and amsgrad off) operation by operation, with each rounding made explicit, so that p, m
// and v are bitwise torch's (tests/optim/test_gpu_adamw.cpp checks it):
//   g  = g / grad_divisor                        (when a divisor is given; IEEE division)
//   p  = p - (lr wd) p                           (one fma, skipped when wd == 0)
//   m  = fma(beta1, m, fma(-beta1, g, g))
//   v  = fma(beta2, v, fma(-beta2, g g, g g))
//   p  = p - (lr / (1 - beta1^step)) m / (sqrt(v) / sqrt(1 - beta2^step) + eps)
// in fp32, the hyper-parameters rounded from double to float as torch rounds them. Two differences
// from torch that change no p, m or v: the gradient is not written back divided by the divisor
// (torch stores it, for GradScaler's benefit; nothing reads it here), and any nonzero found_inf
// skips the step (torch skips on exactly 1; the optimizer only ever passes 0 or 1).
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

namespace fp8tron::kernels {

// The element type of the model's copy of the parameters.
enum class ModelCopyType : int { kNone = 0, kFloat32 = 1, kBFloat16 = 2, kFloat16 = 3 };

// The storage type of both Adam moments (the precision-aware optimizer's --exp-avg-dtype and
// --exp-avg-sq-dtype bf16): bf16 moments are widened exactly to fp32 as they are read, and the
// updated fp32 values rounded to nearest-even as they are stored, Transformer Engine's FusedAdam's
// arithmetic for bf16 states (fp32 math, bf16 storage).
enum class MomentType : int { kFloat32 = 0, kBFloat16 = 1 };

struct AdamWSegment {
  float* param;             // fp32 main weights, n elements
  const float* grad;        // fp32, n elements; read only
  void* exp_avg;            // n elements of `moment_type`
  void* exp_avg_sq;         // n elements of `moment_type`
  MomentType moment_type;
  void* model_copy;         // n elements of `copy_type`, written with the new p; null: none
  ModelCopyType copy_type;  // kNone with a null model_copy
  int64_t numel;
};

// Device scalars, read by the kernel (the host never waits for them).
struct AdamWDeviceScalars {
  const float* step;          // the step count, already advanced for this step (torch's state_steps)
  const float* found_inf;     // nonzero: the step changes nothing (null: never)
  const float* grad_divisor;  // every gradient is divided by it as it is read (null: none)
};

struct AdamWHyperParams {
  double lr, beta1, beta2, eps, weight_decay;  // decoupled weight decay (AdamW)
};

// Any alignment of the pointers (4-byte aligned fp32, 2-byte aligned copies and bf16 moments) and
// any numel >= 0; 16-byte accesses (8-byte for bf16 moments) wherever the pointers allow.
void fused_adamw(const AdamWSegment& segment, const AdamWDeviceScalars& scalars, const AdamWHyperParams& hyper,
                 cudaStream_t stream);

}  // namespace fp8tron::kernels
