// Shared experts (Megatron-Core's SharedExpertMLP): an ordinary tensor-parallel MLP of
// --moe-shared-expert-intermediate-size that sees every token of the MoE layer's input (the
// pre-MLP norm's output; no fused norm, no biases), optionally gated per token by
// sigmoid(x . gate_weight) (--moe-shared-expert-gate). Dense parameters:
// mlp.shared_experts.linear_fc{1,2}.weight and mlp.shared_experts.gate_weight [1, H].
#pragma once
#include <torch/torch.h>

#include "core/config/model_config.h"
#include "models/linear/modules.h"

namespace fp8tron {

class SharedExpertMlpImpl : public ShardedModule {
 public:
  SharedExpertMlpImpl(const ModelConfig& m, const std::string& prefix, const ModuleFactory& factory);
  // x [S(/tp), B, H] -> [S(/tp), B, H].
  torch::Tensor forward(const torch::Tensor& x);

  TEColumnParallelLinear linear_fc1{nullptr};
  TERowParallelLinear linear_fc2{nullptr};
  torch::Tensor gate_weight;  // undefined without --moe-shared-expert-gate

 private:
  bool swiglu_;
};
TORCH_MODULE(SharedExpertMlp);

}  // namespace fp8tron
