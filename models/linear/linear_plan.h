// How one linear layer runs, decided once when the layer is built (resolve_linear_plan) from what
// the layer is and the model's settings: the GEMMs' precision, the tensor-parallel communication
// and whether it is overlapped with the GEMMs (parallel/overlap/), what is fused in front of the
// GEMM (the norm of a norm-fused linear), where the bias is added, and where the weight's gradient
// goes. The modules' forward passes switch on the plan; describe() names it for --print-model-plan.
//
// A plan is the same for CPU and GPU tensors: the fused kernels a plan names run on GPUs, and each
// falls back to the unfused torch ops it replaces on the CPU (the CPU's twin of every path, which
// the tests compare against), or where a tensor does not fit it (another dtype, no tokens, no fp32
// main gradient yet), as each kernel's header says.
#pragma once
#include <string>

#include "parallel/overlap/tp_linear.h"
#include "parallel/sharding.h"

namespace fp8tron {

enum class LinearRole : uint8_t {
  kColumn,      // TEColumnParallelLinear: output features split over the tensor-parallel ranks
  kNormColumn,  // TELayerNormColumnParallelLinear: the same with its input's norm in front
  kRow,         // TERowParallelLinear: input features split, partial outputs summed over the ranks
};

enum class LinearPath : uint8_t {
  kPlain,            // bf16/fp16/fp32 GEMMs (cuBLAS), the collectives around them
  kFp8,              // FP8 GEMMs through the model's FP8 engine (fp8/fp8_linear.h)
  kOverlapped,       // parallel/overlap/'s communicating op, bf16 GEMMs split with the communication
  kOverlappedFp8,    // the same with FP8 GEMMs (models/linear/linear_kernels_fp8.h)
};

// Where a norm-fused linear's norm runs (kNormColumn only).
enum class NormPlacement : uint8_t {
  kNone,
  kResidualNormKernel,  // the fused residual add + norm kernel (models/norm/residual_norm.h), then the GEMM
  kNormLinearOp,        // one op with the GEMM, its normed input not kept for backward (models/linear/norm_linear.h)
  kFp8Cast,             // in the overlapped op, fused into the FP8 cast of this rank's shard
};

// Where the bias is added.
enum class BiasPlacement : uint8_t {
  kNone,
  kGemmEpilogue,     // in the GEMM (one rank holds the whole sum)
  kAfterReduction,   // after the tensor-parallel sum (row-parallel with TP), or after the overlapped op
  kNextNorm,         // left to the next residual add + norm when the caller asks (Megatron's skip_bias_add)
};

struct LinearPlan {
  LinearRole role = LinearRole::kColumn;
  LinearPath path = LinearPath::kPlain;
  int tp_size = 1;
  bool sequence_parallel = false;
  overlap::TpLinearPlan overlap;  // kOverlapped*: each GEMM's method
  NormPlacement norm = NormPlacement::kNone;
  BiasPlacement bias = BiasPlacement::kNone;
  // Gradient-accumulation fusion: the weight's gradient goes into its fp32 main gradient on GPUs.
  bool main_grad_fusion = true;

  bool fp8() const { return path == LinearPath::kFp8 || path == LinearPath::kOverlappedFp8; }
  bool overlapped() const { return path == LinearPath::kOverlapped || path == LinearPath::kOverlappedFp8; }
  // One line, e.g. "FP8 GEMMs | TP 2 with SP: all-gather before, overlapped (fprop ring_exchange, ...)
  // | norm: fused into the FP8 cast | bias: in the GEMM | weight gradient: into its fp32 main gradient".
  std::string describe() const;
};

// What a linear layer is, for its plan.
struct LinearSpec {
  LinearRole role = LinearRole::kColumn;
  std::string name;        // the module's global name ("decoder.layers.3.mlp.linear_fc1")
  bool bias = true;
  bool fp8 = false;        // the FP8 engine gave the layer a site
  bool defer_bias = false;  // row-parallel: the caller may leave the bias to the next norm
};

LinearPlan resolve_linear_plan(const LinearSpec& spec, const TensorParallelContext& tp, bool gradient_accumulation_fusion);

}  // namespace fp8tron
