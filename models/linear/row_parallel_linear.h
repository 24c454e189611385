// TERowParallelLinear: y = x W^T + b with W split by input columns over the tensor-parallel ranks;
// the partial outputs are summed over the group (all-reduce, or reduce-scatter to sequence shards
// with SP) before the bias. An MLP's fc2 also takes its activation (GeLU, SwiGLU) as a prologue,
// fused into the FP8 cast of its input or into a kernel of its own. Where the bias goes is the
// plan's BiasPlacement (models/linear/linear_plan.h): with kNextNorm a call that asks for it
// (defer_bias: no dropout follows) leaves the bias to the caller, whose next norm adds it in its
// kernel (ResidualStream::branch_bias) and sums its gradient, so the wgrad GEMM runs without
// cuBLASLt's BGRADB epilogue (a second kernel reading dY on Hopper).
#pragma once
#include <torch/torch.h>

#include <memory>

#include "fp8/fp8_linear.h"
#include "fp8/quantize.h"
#include "models/linear/linear_options.h"
#include "models/linear/linear_plan.h"
#include "models/norm/residual_norm.h"
#include "parallel/sharding.h"

namespace fp8tron {

// A linear's output, and its bias where the linear left it to the caller (Megatron's
// skip_bias_add): out + bias is the linear's result. bias undefined: none pending.
struct DeferredBiasOutput {
  torch::Tensor out, bias;
};

class TERowParallelLinearImpl : public ShardedModule {
 public:
  TERowParallelLinearImpl(const LinearOptions& options, const ModuleFactory& factory);
  // `rebuild_x` (may be empty): returns x from what its producer keeps for backward anyway
  // (fp8_linear's; the attention's output), on the paths without tensor-parallel overlap.
  torch::Tensor forward(const torch::Tensor& x, const fp8::InputRebuild& rebuild_x = {});
  DeferredBiasOutput forward_deferring_bias(const torch::Tensor& x, bool defer_bias,
                                            const fp8::InputRebuild& rebuild_x = {});
  // forward(gelu_tanh(x)); with FP8 the GeLU is fused into the cast of the GEMM input.
  DeferredBiasOutput forward_gelu(const torch::Tensor& x, bool defer_bias = false);
  // forward(silu(gate) * up) of x = [gate | up]; with FP8 fused into the cast of the GEMM input,
  // else one kernel each way on a GPU (models/mlp/fused_swiglu.h).
  DeferredBiasOutput forward_swiglu(const torch::Tensor& x, bool defer_bias = false);
  // forward(gelu_tanh(x W1^T + b1)) of the dense bf16 MLP with fc1 (weight W1, bias b1: this
  // rank's) run here too, as one op that saves fc1's pre-activation only (models/mlp/fused_gelu_mlp.h):
  // x is fc1's GEMM input (TELayerNormColumnParallelLinear::gemm_input). Only where
  // fused_gelu_mlp_applies.
  DeferredBiasOutput forward_fused_gelu_mlp(const torch::Tensor& x, const torch::Tensor& fc1_weight,
                                            const torch::Tensor& fc1_bias, bool defer_bias);
  // forward_fused_gelu_mlp of fc1's norm of the stream, the norm run in the same op
  // (fused_norm_gelu_mlp): fc1_norm from TELayerNormColumnParallelLinear::fusable_norm.
  ResidualOutput forward_fused_norm_gelu_mlp(const ResidualStream& in, const NormPrologue& fc1_norm,
                                             const torch::Tensor& fc1_weight, const torch::Tensor& fc1_bias,
                                             bool defer_bias);
  // Whether the fused GeLU MLP runs: this linear's plan is the plain one and the tensors fit
  // (fused_gelu_mlp_blocker). x: fc1's GEMM input, or any tensor of its dtype, device and width.
  bool fused_gelu_mlp_applies(const torch::Tensor& x, const torch::Tensor& fc1_weight,
                              const torch::Tensor& fc1_bias) const;
  const LinearPlan& plan() const { return plan_; }

  LinearOptions options;
  TensorParallelContext tp;
  torch::Tensor weight, bias;
  std::shared_ptr<fp8::Fp8Site> fp8_site;
  MainGradsPtr main_grads;

 private:
  // The FP8 paths with `prologue` fused into the cast of x.
  torch::Tensor fp8_forward(const torch::Tensor& x, fp8::Prologue prologue);
  // Partial outputs summed over the group (all-reduce, or reduce-scatter under SP), then the bias
  // unless deferred.
  torch::Tensor reduce_and_add_bias(const torch::Tensor& partial, bool deferred = false);
  // The bias the GEMM adds itself (one rank, unless deferred).
  torch::Tensor own_bias(bool deferred = false) const;
  // Whether a call on x asking for defer_bias leaves the bias to its caller (the plan allows it,
  // on a GPU: the CPU keeps the bias in the GEMM, its results those of the unfused model).
  bool defers_bias(const torch::Tensor& x, bool defer_bias) const;
  DeferredBiasOutput output(const torch::Tensor& partial, bool deferred);
  LinearPlan plan_;
};
TORCH_MODULE(TERowParallelLinear);

}  // namespace fp8tron
