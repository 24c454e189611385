// TELayerNormColumnParallelLinear: norm(x) W^T (+ b), Transformer Engine's LayerNormLinear, the
// column-parallel linear with its input's norm in front. Where the norm runs is its plan's
// NormPlacement (models/linear/linear_plan.h): the fused residual add + norm kernel, one op with
// the GEMM (bf16 on one rank), or fused into the overlapped op's FP8 cast.
#pragma once
#include <torch/torch.h>

#include <memory>
#include <optional>

#include "fp8/fp8_linear.h"
#include "models/linear/linear_options.h"
#include "models/linear/linear_plan.h"
#include "models/norm/norm.h"
#include "models/norm/residual_norm.h"
#include "parallel/sharding.h"

namespace fp8tron {

class TELayerNormColumnParallelLinearImpl : public ShardedModule {
 public:
  TELayerNormColumnParallelLinearImpl(const NormOptions& norm, const LinearOptions& linear, const ModuleFactory& factory);
  torch::Tensor forward(const torch::Tensor& x);
  // forward() of the stream's sum, returned too, the pending add fused into the norm. Under the
  // overlapped op the sum is formed first and forward() runs on it.
  ResidualOutput forward_residual(const ResidualStream& in);
  // The GEMM's input: x normed, entered into the tensor-parallel region (all-gathered under SP).
  // The dense MLP's fused GeLU path (TERowParallelLinear::forward_fused_gelu_mlp) runs fc1 on it.
  torch::Tensor gemm_input(const torch::Tensor& x);
  // gemm_input() of the stream's sum, with the sum: the pending add fused into the norm.
  ResidualOutput gemm_input_residual(const ResidualStream& in);
  // The norm as a prologue of this rank's GEMM in one op (NormPlacement::kNormLinearOp), where the
  // norm's kernels take the stream's tensors; otherwise nullopt. The fused GeLU MLP runs it too.
  std::optional<NormPrologue> fusable_norm(const ResidualStream& in) const;
  const LinearPlan& plan() const { return plan_; }

  NormOptions norm_options;
  LinearOptions linear_options;
  TensorParallelContext tp;
  torch::Tensor layer_norm_weight, layer_norm_bias, weight, bias;
  std::shared_ptr<fp8::Fp8Site> fp8_site;
  MainGradsPtr main_grads;

 private:
  // Whether the norm + linear op runs on `in` (the norm fusable, gradient-accumulation fusion
  // applies to the weight).
  std::optional<NormPrologue> norm_linear_fits(const ResidualStream& in) const;
  fp8::InputRebuild norm_rebuild(const torch::Tensor& sum) const;
  LinearPlan plan_;
};
TORCH_MODULE(TELayerNormColumnParallelLinear);

}  // namespace fp8tron
