// The fused AdamW step where some optimizer state is stored scaled per parameter (the
// precision-aware optimizer's fp16 / fp8 moments and fp16 main weights, optim/scaled_state.h),
// torch-free: raw pointers, sizes and a stream. The other states may be fp32 or bf16 (a mixed
// pair of moments, fp32 main weights): each of p, m and v is read and written by its own type.
//
// A new scale needs the new values' absolute maximum before any of them is stored, so the step
// runs twice over the elements without keeping fp32 copies: the first pass computes every new p,
// m and v (scaled ones read back as stored x factor, then the fused kernel's AdamW arithmetic,
// optim/adamw_math.cuh) and reduces the scaled ones' absolute maxima per parameter; the second
// computes them again, bit for bit the same, and stores them (scaled ones with the new scales) and
// the model's copy of p, from its fp32 value before any rounding (as Transformer Engine's FusedAdam
// writes it); a third, one thread per parameter, records the new factors and maxima. About 31
// bytes moved per element for fp8/fp16 moments and a bf16 copy, where reading back to fp32 copies,
// torch's fused AdamW and storing again move about 130. The scales, stored values and weights are
// those optim/scaled_state.cpp's torch operations give (tests/optim/test_gpu_adamw.cpp checks it):
// IEEE division and reciprocals, round-to-nearest-even, FP8 saturated to +-448.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "optim/adamw_kernels.h"

namespace fp8tron::kernels {

// How a state is stored: plain fp32 or bf16 (read exactly, stored rounded to nearest-even), or
// scaled per parameter in fp16 or E4M3.
enum class StateType : int { kFloat32 = 0, kBFloat16 = 1, kFloat16Scaled = 2, kFloat8E4M3Scaled = 3 };

struct StateBuffers {
  void* data;  // the state's elements, of `type`
  StateType type;
  // Scaled types only (null otherwise), per parameter:
  float* factors;   // stored x factor reads a value back
  float* amaxes;    // the absolute maximum its scale came from
  float* new_amax;  // scratch: zeroed by the caller before the step
};

// Elements [begin, end) of the buffers, all of parameter `piece`; a parameter's chunks are
// consecutive in the list.
struct ScaledChunk {
  int64_t begin, end;
  int64_t piece;
};

struct ScaledAdamWStep {
  const float* grad;  // fp32; read only
  StateBuffers param, exp_avg, exp_avg_sq;  // the main weights (fp32 or fp16 scaled) and moments
  void* model_copy;   // written with the new p; null: none
  ModelCopyType copy_type;
  const ScaledChunk* chunks;  // device memory
  int64_t num_chunks;
  int64_t first_piece, num_pieces;  // the parameters the chunks cover
};

void scaled_fused_adamw(const ScaledAdamWStep& s, const AdamWDeviceScalars& scalars, const AdamWHyperParams& hyper,
                        cudaStream_t stream);

}  // namespace fp8tron::kernels
