// The overlapped paths of the tensor-parallel linears (LinearPath::kOverlapped, kOverlappedFp8):
// parallel/overlap/'s communicating op (pipelined all-gather + GEMM, GEMM + reduce-scatter) over
// the GEMM functor of the layer's precision (models/linear/linear_kernels_plain.h, _fp8.h).
#pragma once
#include <torch/torch.h>

#include <memory>
#include <vector>

#include "fp8/quantize.h"
#include "models/linear/linear_kernels_fp8.h"
#include "models/linear/linear_kernels_plain.h"
#include "models/norm/norm.h"
#include "parallel/sharding.h"
#include "parallel/tensor_parallel.h"
#include "parallel/overlap/tp_linear.h"

namespace fp8tron {

// The GEMM functor of one call: FP8 with `site` (and the prologue fused into its input cast), else
// the plain GEMMs.
std::shared_ptr<overlap::LinearKernels> overlap_kernels(const torch::Tensor& w, const torch::Tensor& b,
                                                        const std::shared_ptr<fp8::Fp8Site>& site,
                                                        const TensorParallelContext& tp, const overlap::TpLinearPlan& plan,
                                                        fp8::Prologue prologue = fp8::Prologue::kNone);

// Column-parallel: the sequence shards all-gathered while the GEMMs run; y = x W^T + b on this
// rank's output features.
torch::Tensor overlapped_column_linear(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b,
                                       const std::shared_ptr<fp8::Fp8Site>& site, const TensorParallelContext& tp,
                                       const overlap::TpLinearPlan& plan);

// Row-parallel: the partial outputs reduce-scattered as the GEMMs produce them, then the bias; the
// prologue (GeLU, SwiGLU) fused into the FP8 cast of x.
torch::Tensor overlapped_row_linear(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& bias,
                                    const std::shared_ptr<fp8::Fp8Site>& site, const TensorParallelContext& tp,
                                    const overlap::TpLinearPlan& plan, fp8::Prologue prologue);

// Column-parallel with the norm of x fused into the FP8 cast of this rank's shard (before the
// all-gather): NormPlacement::kFp8Cast, where fused_norm_cast_available.
torch::Tensor overlapped_norm_fp8_linear(const torch::Tensor& x, const NormOptions& norm, const torch::Tensor& gamma,
                                         const torch::Tensor& beta, const torch::Tensor& w, const torch::Tensor& b,
                                         fp8::Fp8Site& site, const TensorParallelContext& tp,
                                         const overlap::TpLinearPlan& plan);

}  // namespace fp8tron
