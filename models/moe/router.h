// TopKRouter (Megatron-Core's MoE/router.py): the gating linear, scores and top-k selection
// (models/moe/routing.h), capacity dropping, the auxiliary losses attached to the probs
// (models/moe/aux_loss.h), the z-loss attached to the logits, and the expert-bias statistics.
// Parameters: weight [E, H] (replicated over tensor-parallel ranks; its gradient is partial per
// rank under sequence parallelism), bias [E] with biased linears, and the persistent fp32 buffer
// expert_bias [E] (checkpointed) with --moe-router-enable-expert-bias.
#pragma once
#include <torch/torch.h>

#include <memory>
#include <optional>
#include <string>

#include "core/config/model_config.h"
#include "models/module_factory.h"
#include "models/moe/aux_loss.h"
#include "models/moe/moe_context.h"
#include "models/moe/routing.h"

namespace fp8tron {

class TopKRouterImpl : public ShardedModule {
 public:
  // `layer`: the global 0-based layer number (metrics are recorded per layer).
  TopKRouterImpl(const ModelConfig& m, const std::string& prefix, int64_t layer, const ModuleFactory& factory,
                 std::shared_ptr<MoeContext> context);
  // x [S, B, H] (this rank's sequence shard): probs and map over its S * B tokens, s-major.
  moe::Routing forward(const torch::Tensor& x);

  // Logits [T, E] in the router dtype (--moe-router-dtype; the input's dtype without it).
  torch::Tensor gating(const torch::Tensor& x2d) const;

  // Expert-bias statistics of this step (tokens routed per expert after capacity dropping),
  // and the global aux loss's accumulators; MoeContext::end_step folds and resets them.
  torch::Tensor local_tokens_per_expert() const { return local_tokens_per_expert_; }
  void update_expert_bias(const torch::Tensor& summed_counts);
  void reset_step_statistics();

  torch::Tensor weight, bias, expert_bias;
  int64_t layer() const { return layer_; }

 private:
  // fused_aux: the aux scores the fused routing kernel already computed (else recomputed here).
  torch::Tensor attach_balancing_losses(torch::Tensor probs, const torch::Tensor& logits, int64_t seq, int64_t batch,
                                        const std::optional<moe::AuxScores>& fused_aux);
  torch::Tensor attach_z_loss(const torch::Tensor& logits);
  // The map's column sums (fp32; `known` when given) summed over the group.
  torch::Tensor counts_over(const torch::Tensor& map, Communicator& group, const torch::Tensor& known = {}) const;

  MoeConfig config_;
  int64_t layer_;
  std::shared_ptr<MoeContext> context_;
  torch::Tensor local_tokens_per_expert_;   // [E] fp32, with the expert bias
  torch::Tensor global_tokens_per_expert_;  // [E] fp32, with global_aux_loss
  int64_t global_aux_micro_batches_ = 0;
};
TORCH_MODULE(TopKRouter);

}  // namespace fp8tron
