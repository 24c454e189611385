// The arithmetic of one AdamW element, shared by the fused kernels (adamw_kernels.cu,
// scaled_adamw_kernels.cu): torch's _fused_adamw_ operation by operation with every rounding
// spelled out (optim/adamw_kernels.h says which).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "optim/adamw_kernels.h"

namespace fp8tron::kernels {

// The hyper-parameters as the kernels take them: rounded from double on the host, as torch does
// on the device.
struct AdamWFloats {
  float lr, beta1, beta2, eps, weight_decay;
};

inline AdamWFloats adamw_floats(const AdamWHyperParams& h) {
  return {float(h.lr), float(h.beta1), float(h.beta2), float(h.eps), float(h.weight_decay)};
}

// The step's constants, as torch's functor derives them from the device step count.
struct StepConstants {
  float beta1, beta2, eps, lr_wd, step_size, bias_correction2_sqrt, divisor;
  bool decay, divide;
};

__device__ __forceinline__ StepConstants step_constants(const AdamWFloats& h, const AdamWDeviceScalars& s) {
  StepConstants c;
  const float step = *s.step;
  c.beta1 = h.beta1;
  c.beta2 = h.beta2;
  c.eps = h.eps;
  const float bias_correction1 = __fsub_rn(1.0f, powf(h.beta1, step));
  c.step_size = __fdiv_rn(h.lr, bias_correction1);
  c.bias_correction2_sqrt = __fsqrt_rn(__fsub_rn(1.0f, powf(h.beta2, step)));
  c.lr_wd = __fmul_rn(h.lr, h.weight_decay);
  c.decay = h.weight_decay != 0.0f;
  c.divide = s.grad_divisor != nullptr;
  c.divisor = c.divide ? *s.grad_divisor : 1.0f;
  return c;
}

// One element, every rounding spelled out (intrinsics: no contraction or flag can change them).
__device__ __forceinline__ void adamw_element(float& p, float g, float& m, float& v, const StepConstants& c) {
  if (c.divide) g = __fdiv_rn(g, c.divisor);
  if (c.decay) p = __fmaf_rn(p, -c.lr_wd, p);  // p - (lr wd) p, one rounding (torch's compiled form)
  m = __fmaf_rn(c.beta1, m, __fmaf_rn(-c.beta1, g, g));
  const float g2 = __fmul_rn(g, g);
  v = __fmaf_rn(c.beta2, v, __fmaf_rn(-c.beta2, g2, g2));
  const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(v), c.bias_correction2_sqrt), c.eps);
  p = __fsub_rn(p, __fdiv_rn(__fmul_rn(c.step_size, m), denom));
}

template <class C> __device__ __forceinline__ C rounded(float v);
template <> __device__ __forceinline__ float rounded(float v) { return v; }
template <> __device__ __forceinline__ __nv_bfloat16 rounded(float v) { return __float2bfloat16_rn(v); }
template <> __device__ __forceinline__ __half rounded(float v) { return __float2half_rn(v); }

// The model copy's value of element i (C void: none).
template <class C>
__device__ __forceinline__ void store_copy(void* copy, int64_t i, float p) {
  if constexpr (!std::is_void_v<C>) static_cast<C*>(copy)[i] = rounded<C>(p);
}

}  // namespace fp8tron::kernels
