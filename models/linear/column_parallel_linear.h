// TEColumnParallelLinear: y = x W^T (+ b) with W split by output rows over the tensor-parallel
// ranks; the input enters the parallel region (copied, or its sequence shards all-gathered under
// SP). Its LinearPlan (models/linear/linear_plan.h) is decided when it is built.
#pragma once
#include <torch/torch.h>

#include <memory>

#include "fp8/fp8_linear.h"
#include "models/linear/linear_options.h"
#include "models/linear/linear_plan.h"
#include "models/linear/wgrad_deferral.h"
#include "parallel/sharding.h"

namespace fp8tron {

class TEColumnParallelLinearImpl : public ShardedModule {
 public:
  TEColumnParallelLinearImpl(const LinearOptions& options, const ModuleFactory& factory);
  torch::Tensor forward(const torch::Tensor& x);
  // Shares an existing weight (the tied output layer uses the word embedding).
  torch::Tensor forward_with(const torch::Tensor& x, const torch::Tensor& weight);
  const LinearPlan& plan() const { return plan_; }

  LinearOptions options;
  TensorParallelContext tp;
  torch::Tensor weight, bias;
  std::shared_ptr<fp8::Fp8Site> fp8_site;  // LinearPath::kFp8 / kOverlappedFp8
  MainGradsPtr main_grads;
  // Set: in training, the weight gradients go through it (models/linear/wgrad_deferral.h).
  std::shared_ptr<WgradDeferral> wgrad_deferral;

 private:
  LinearPlan plan_;
};
TORCH_MODULE(TEColumnParallelLinear);

// Enters the tensor-parallel region: all-gather of sequence shards (SP) or identity with an
// all-reduce in backward.
torch::Tensor enter_tensor_parallel(const torch::Tensor& x, const TensorParallelContext& tp);
// y = x W^T + b on this rank's GEMMs: FP8 through the site (`rebuild_x`: fp8_linear's), else the
// plain linear with gradient-accumulation fusion (models/linear/fused_linear.h).
torch::Tensor rank_linear(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b,
                          const std::shared_ptr<fp8::Fp8Site>& site, const MainGradsPtr& main_grads,
                          const fp8::InputRebuild& rebuild_x = {});

}  // namespace fp8tron
