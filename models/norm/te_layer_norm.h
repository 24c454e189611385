// TELayerNorm: a LayerNorm / RMSNorm module under Transformer Engine's parameter names (weight,
// bias), run through the fused residual add + norm kernel on GPUs (models/norm/residual_norm.h).
#pragma once
#include <torch/torch.h>

#include "models/linear/main_grads.h"
#include "models/module_factory.h"
#include "models/norm/norm.h"
#include "models/norm/residual_norm.h"
#include "parallel/sharding.h"

namespace fp8tron {

// `partial_grads`: the input is a sequence shard (SP) or a head shard (QK norm), so each
// tensor-parallel rank holds a partial gradient that must be summed over the group.
class TELayerNormImpl : public ShardedModule {
 public:
  TELayerNormImpl(const NormOptions& options, bool partial_grads, const ModuleFactory& factory);
  torch::Tensor forward(const torch::Tensor& x);
  // The norm of the stream's sum with the pending add fused into it (models/norm/residual_norm.h).
  ResidualNormOutput forward_residual(const ResidualStream& in);
  NormOptions options;
  torch::Tensor weight, bias;
  MainGradsPtr main_grads;  // the model's (models/linear/main_grads.h)
};
TORCH_MODULE(TELayerNorm);

// Registers a norm's parameters on `m` under `prefix` ("" or "layer_norm_"): gamma starts at 1 (0
// when stored zero-centred), beta at 0 (LayerNorm only).
void add_norm_params(ShardedModule& m, const NormOptions& o, bool partial_grads, const ModuleFactory& f,
                     const std::string& prefix, torch::Tensor& weight, torch::Tensor& bias);

}  // namespace fp8tron
