// Megatron-Core's MoELayer: the MLP of an MoE transformer layer. Router -> token dispatch ->
// routed experts -> token combine (probability-weighted), plus the shared expert on every token.
// Names under decoder.layers.N.mlp: router.{weight, expert_bias}, experts.linear_fc{1,2}.weight<g>,
// shared_experts.{linear_fc1, linear_fc2}.weight, shared_experts.gate_weight.
// --moe-shared-expert-overlap (alltoall dispatcher): on a GPU the shared expert's forward runs on
// a side stream while the tokens are dispatched; the math is the same as without it.
// --moe-dispatch-fp8 (alltoall dispatcher, FP8 experts of a per-block recipe): the tokens travel as
// the codes and scales the experts' fc1 uses as they arrive (token_dispatcher.h).
// --recompute-modules moe / shared_experts (selective granularity): the whole layer, or the shared
// expert, keeps only its input and is replayed in backward (models/recompute/recompute.h).
#pragma once
#include <torch/torch.h>

#include <memory>

#include "models/moe/experts.h"
#include "models/moe/moe_context.h"
#include "models/moe/router.h"
#include "models/moe/shared_experts.h"
#include "models/moe/token_dispatcher.h"

namespace fp8tron {

class MoeLayerImpl : public torch::nn::Module {
 public:
  // `dense`: the factory of the dense (attention) tensor-parallel group; `layer`: global 0-based.
  MoeLayerImpl(const ModelConfig& m, const std::string& prefix, int64_t layer, const ModuleFactory& dense,
               std::shared_ptr<MoeContext> context);
  // x [S(/tp), B, H] (the pre-MLP norm's output) -> [S(/tp), B, H].
  torch::Tensor forward(const torch::Tensor& x);

  TopKRouter router{nullptr};
  GroupedMlp experts{nullptr};
  SharedExpertMlp shared_experts{nullptr};

 private:
  torch::Tensor compute(const torch::Tensor& x);
  torch::Tensor shared_output(const torch::Tensor& x);
  torch::Tensor routed(const torch::Tensor& x2d, const moe::Routing& routing);
  std::shared_ptr<MoeContext> context_;
  std::unique_ptr<TokenDispatcher> dispatcher_;
  bool overlap_shared_ = false;
  bool recompute_layer_ = false;   // --recompute-modules moe
  bool recompute_shared_ = false;  // --recompute-modules shared_experts
};
TORCH_MODULE(MoeLayer);

// The expert tensor-parallel context of `context`'s groups (what TEGroupedLinear shards over).
TensorParallelContext expert_tensor_parallel(const MoeContext& context);

}  // namespace fp8tron
