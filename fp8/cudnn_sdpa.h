// FP8 scaled dot-product attention on Hopper through cuDNN's fused FP8 kernels (the cuDNN
// frontend's sdpa_fp8 / sdpa_fp8_backward graphs, as Transformer Engine's fused attention uses
// them). Torch-free: raw device pointers, a stream and a caller-provided workspace; each graph is
// built once per shape and format and cached.
//
// Layout: every [b, heads, s, d] operand is stored sequence-first, [s, b, heads, d] row-major, as
// the model's activations are, so neither the inputs nor the output are transposed. Causal
// attention, no dropout, no bias; grouped keys and values (heads % kv_heads == 0).
//
// Scaling (per-tensor): each FP8 input comes with its descale (1 / the scale it was cast with);
// each FP8 output is written as convert(value * scale) with the given scale, and its amax (of the
// unscaled values) is returned, as Transformer Engine's delayed scaling needs. S is the softmax
// output, dP the gradient of the softmax input, both quantized inside the kernels.
#pragma once
#include <cstddef>
#include <cstdint>

#include "fp8/formats.h"

struct CUstream_st;

namespace fp8tron::fp8 {

struct SdpaShape {
  int64_t batch = 0, heads = 0, kv_heads = 0, seq = 0, head_dim = 0;
  float attn_scale = 1.0f;  // softmax(attn_scale * Q K^T)
};

struct SdpaFp8ForwardArgs {
  const void *q = nullptr, *k = nullptr, *v = nullptr;  // E4M3 codes
  const float *descale_q = nullptr, *descale_k = nullptr, *descale_v = nullptr;
  const float *descale_s = nullptr, *scale_s = nullptr, *scale_o = nullptr;
  void* o = nullptr;         // E4M3 codes
  float* stats = nullptr;    // [b, heads, s] log-sum-exp of each softmax row
  float* amax_s = nullptr;   // [1]
  float* amax_o = nullptr;   // [1]
};

struct SdpaFp8BackwardArgs {
  const void *q = nullptr, *k = nullptr, *v = nullptr, *o = nullptr;  // E4M3 codes of the forward pass
  const void* d_o = nullptr;                                           // grad_format codes
  const float* stats = nullptr;
  const float *descale_q = nullptr, *descale_k = nullptr, *descale_v = nullptr, *descale_o = nullptr;
  const float *descale_do = nullptr, *descale_s = nullptr, *descale_dp = nullptr;
  const float *scale_s = nullptr, *scale_dq = nullptr, *scale_dk = nullptr, *scale_dv = nullptr,
              *scale_dp = nullptr;
  void *dq = nullptr, *dk = nullptr, *dv = nullptr;  // grad_format codes
  float *amax_dq = nullptr, *amax_dk = nullptr, *amax_dv = nullptr, *amax_dp = nullptr;
};

// Whether this build has the cuDNN frontend (scripts/setup.sh fetches its headers).
bool cudnn_sdpa_built();

// Workspace bytes the graph of `shape` needs (builds and caches the graph). grad_format: the
// format of dO, dP, dQ, dK and dV (E4M3 or E5M2). Throws UserError naming the unsupported shape.
size_t sdpa_fp8_forward_workspace(const SdpaShape& shape, int device);
size_t sdpa_fp8_backward_workspace(const SdpaShape& shape, Format grad_format, int device);

void sdpa_fp8_forward(const SdpaShape& shape, const SdpaFp8ForwardArgs& args, void* workspace, int device,
                      CUstream_st* stream);
void sdpa_fp8_backward(const SdpaShape& shape, Format grad_format, const SdpaFp8BackwardArgs& args, void* workspace,
                       int device, CUstream_st* stream);

}  // namespace fp8tron::fp8
