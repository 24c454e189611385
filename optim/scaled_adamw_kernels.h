// The fused AdamW step for moments stored scaled per parameter (the precision-aware optimizer's
// fp16 / fp8 states, optim/scaled_state.h), torch-free: raw pointers, sizes and a stream.
//
// A new scale needs the new moments' absolute maximum before any of them is stored, so the step
// runs twice over the elements without keeping fp32 copies: the first pass computes every new m
// and v (read back as stored x factor, then the fused kernel's AdamW arithmetic,
// optim/adamw_math.cuh) and reduces their absolute maxima per parameter; the second computes
// them again, bit for bit the same, and stores p, the model's copy and the moments with the new
// scales; a third, one thread per parameter, records the new factors and maxima. About 31 bytes
// moved per element for fp8/fp16 moments and a bf16 copy, where reading back to fp32 copies,
// torch's fused AdamW and storing again move about 130. The scales, stored values and weights are
// those optim/scaled_state.cpp's torch operations give (tests/optim/test_gpu_adamw.cpp checks
// it): IEEE division and reciprocals, round-to-nearest-even, FP8 saturated to +-448.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "optim/adamw_kernels.h"

namespace fp8tron::kernels {

enum class ScaledType : int { kFloat16 = 0, kFloat8E4M3 = 1 };

struct ScaledStateBuffers {
  void* stored;     // the moment's elements (fp16 or E4M3 codes)
  ScaledType type;
  float* factors;   // per parameter: stored x factor reads a value back
  float* amaxes;    // per parameter: the absolute maximum its scale came from
  float* new_amax;  // per parameter, scratch: zeroed by the caller before the step
};

// Elements [begin, end) of the buffers, all of parameter `piece`; a parameter's chunks are
// consecutive in the list.
struct ScaledChunk {
  int64_t begin, end;
  int64_t piece;
};

struct ScaledAdamWStep {
  float* param;                // fp32 main weights
  const float* grad;           // fp32; read only
  ScaledStateBuffers exp_avg, exp_avg_sq;
  void* model_copy;            // written with the new p; null: none
  ModelCopyType copy_type;
  const ScaledChunk* chunks;   // device memory
  int64_t num_chunks;
  int64_t first_piece, num_pieces;  // the parameters the chunks cover
};

void scaled_fused_adamw(const ScaledAdamWStep& s, const AdamWDeviceScalars& scalars, const AdamWHyperParams& hyper,
                        cudaStream_t stream);

}  // namespace fp8tron::kernels
