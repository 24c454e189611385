// CUDA kernels of the fused residual add + LayerNorm / RMSNorm (models/norm/residual_norm.h), torch-free:
// raw pointers, sizes and a stream. Activations are row-major [rows, hidden], contiguous, in
// `dtype`, as are gamma and beta [hidden]; the statistics are fp32 [rows]. The math runs in fp32
// and every stored value is rounded once.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/cuda/float_type.h"

namespace fp8tron::kernels {

// The widest row the kernels take: a row lives in registers, at most 16 values per thread and 512
// threads per row. Wider rows run torch's unfused ops (models/norm/residual_norm.cpp).
constexpr int64_t kResidualNormMaxHidden = 8192;

struct ResidualNormShape {
  int64_t rows = 0;
  int64_t hidden = 0;  // 1 .. kResidualNormMaxHidden
  FloatType dtype = FloatType::kFloat32;
  bool rms = false;           // RMSNorm: no mean, no beta
  float epsilon = 1e-5f;
  float gamma_offset = 0.0f;  // 1 for a zero-centred gamma (the weight stores gamma - 1)
};

// The forward's pointers: inputs, then outputs.
struct ResidualNormForwardIo {
  const void* residual = nullptr;
  const void* branch = nullptr;       // null: the norm of residual alone, and sum is not written
  const void* branch_bias = nullptr;  // [hidden], null: none; needs a branch (Megatron's deferred
                                      // bias of the sub-layer's output projection)
  const void* gamma = nullptr;
  const void* beta = nullptr;         // null: no shift
  void* sum = nullptr;                // may be null without a branch
  void* normed = nullptr;
  float* mean = nullptr;              // null for RMSNorm
  float* rstd = nullptr;
};

// sum = residual + (branch + branch_bias), each add rounded to dtype as torch's add rounds it;
// normed = norm(sum) * gamma (+ beta), with the mean (LayerNorm) and rstd = 1 / sqrt(variance or
// mean square + epsilon) of each row in fp32.
void residual_norm_forward(const ResidualNormShape& shape, const ResidualNormForwardIo& io, cudaStream_t stream);

// How many rows of per-block partial sums the backward's parameter gradients may use on the current
// device: its workspace is 3 x that x hidden fp32 values (gamma's partials, beta's, then the branch
// bias's).
int64_t residual_norm_workspace_rows(const ResidualNormShape& shape);

// Where one of the backward's sums over rows goes (gamma's, beta's or the branch bias's gradient):
// in the activations' dtype (a gradient for autograd), or in fp32 (a parameter's fp32 main
// gradient, or an fp32 gradient), written or added to.
struct SummedGradOut {
  void* data = nullptr;     // null: not wanted
  bool fp32 = false;
  bool accumulate = false;  // fp32 only: added to the values there instead of written
};

// The backward's pointers: inputs, then outputs (optional ones may be null).
struct ResidualNormBackwardIo {
  const void* d_normed = nullptr;
  const void* d_sum = nullptr;  // null: zero
  const void* sum = nullptr;    // the forward's saved sum (its input without a branch)
  const void* gamma = nullptr;
  const void* beta = nullptr;   // only read to write `normed` (LayerNorm with a shift)
  const float* mean = nullptr;  // null for RMSNorm
  const float* rstd = nullptr;
  void* d_in = nullptr;
  SummedGradOut d_gamma;        // [hidden]
  SummedGradOut d_beta;         // [hidden]; none for RMSNorm
  void* normed = nullptr;       // non-null: norm(sum) written again, bitwise the forward's output
  SummedGradOut d_branch_bias;  // fp32 [hidden]: the sum of d_in over rows
  float* workspace = nullptr;   // with any of the three sums: residual_norm_workspace_rows x 3 x hidden floats
  int64_t workspace_rows = 0;
};

// d_in = d_sum + the norm's input gradient for d_normed, in one rounding, from the saved sum and
// statistics. With d_gamma or d_beta also the gradients of gamma and (LayerNorm) beta, and with
// d_branch_bias the branch bias's (the sum over rows of d_in as stored), in fp32: each
// block accumulates its rows' contributions in fp32, one partial row per block goes to
// `workspace`, and a second kernel sums the partial rows in a fixed order, so the results are
// bitwise the same on every run (no atomics). With `normed` the pass also writes the norm's output
// again, bit for bit what the forward wrote: a GEMM that read it (a weight gradient) need not keep
// it from the forward, and rebuilding it here costs one store next to the loads the pass makes
// anyway (models/linear/norm_linear.h).
void residual_norm_backward(const ResidualNormShape& shape, const ResidualNormBackwardIo& io, cudaStream_t stream);

}  // namespace fp8tron::kernels
