// Mixture of experts (--num-experts and the --moe-* flags): which layers are MoE layers, how the
// router scores and selects experts, the load-balancing losses, capacity and padding, shared
// experts and the token dispatcher. Megatron-Core's semantics (TransformerConfig's moe_* fields);
// models/moe/ builds the layer from this, parallel/ knows nothing of it.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace fp8tron {

enum class MoeScoreFunction { kSoftmax, kSigmoid, kSqrtSoftplus };
// --moe-router-load-balancing-type. quantile_balancing is refused by name (trainer/cli).
enum class MoeBalancing { kAuxLoss, kSeqAuxLoss, kGlobalAuxLoss, kSinkhorn, kNone };
enum class MoeDispatcher { kAllGather, kAllToAll };
enum class MoeDropPolicy { kProbs, kPosition };
// --moe-router-dtype: the gating GEMM's output and all routing math; kInput = the activations' dtype.
enum class MoeRouterDtype { kInput, kFp32, kFp64 };

// One --moe-router-load-balancing-type entry with its --moe-aux-loss-coeff.
struct MoeBalancingTerm {
  MoeBalancing type = MoeBalancing::kAuxLoss;
  double coeff = 0.0;
};

struct MoeConfig {
  int64_t num_experts = 0;      // 0: a dense model
  int64_t ffn_hidden_size = 0;  // --moe-ffn-hidden-size (defaults to --ffn-hidden-size)
  // --moe-layer-freq resolved per global layer: true = MoE layer.
  std::vector<bool> layer_pattern;
  int64_t topk = 2;
  MoeScoreFunction score_function = MoeScoreFunction::kSoftmax;
  bool pre_softmax = false;
  std::optional<double> topk_scaling_factor;  // unset or 0: no scaling
  MoeRouterDtype router_dtype = MoeRouterDtype::kInput;
  // The balancing types in flag order. Megatron stores a single type as a string and several as
  // a list; the logged metric names differ between the two (a substring test on the string),
  // so the form is kept.
  std::vector<MoeBalancingTerm> balancing = {MoeBalancingTerm{}};
  bool balancing_is_list = false;
  std::optional<double> z_loss_coeff;
  std::optional<double> input_jitter_eps;
  bool force_load_balancing = false;  // --moe-router-force-load-balancing (benchmarks)
  bool enable_expert_bias = false;
  double bias_update_rate = 1e-3;
  std::optional<int64_t> num_groups, group_topk;  // group-limited routing
  int64_t shared_expert_size = 0;                  // --moe-shared-expert-intermediate-size (0: none)
  bool shared_expert_gate = false;
  bool shared_expert_overlap = false;
  // --overlap-moe-expert-parallel-comm: the combined 1F1B schedule, one micro-batch's forward and
  // another's backward taking turns at each expert-parallel all-to-all (docs/moe.md).
  bool overlap_expert_parallel_comm = false;
  // --delay-wgrad-compute (with the overlap): the transformer layers' weight-gradient GEMMs are
  // held and run while the backward pass's next all-to-all is in flight (docs/moe.md).
  bool delay_wgrad_compute = false;
  std::optional<double> capacity_factor;  // unset: dropless
  bool pad_to_capacity = false;
  MoeDropPolicy drop_policy = MoeDropPolicy::kProbs;
  bool router_padding_for_quantization = false;  // --moe-router-padding-for-fp8/-quantization
  bool per_layer_logging = false;
  MoeDispatcher dispatcher = MoeDispatcher::kAllGather;
  // --moe-dispatch-fp8 (fp8tron's own): the alltoall dispatcher sends each token quantized once, in
  // the FP8 experts' per-block recipe (blockwise or MXFP8), codes and scales that their first
  // grouped GEMM uses as they arrive; combine and gradients stay in the activations' dtype.
  bool dispatch_fp8 = false;
  bool expert_gemm_fp8 = true;  // !--no-use-gmm-fp8: the experts' grouped GEMMs run in FP8 in FP8 runs

  bool enabled() const { return num_experts > 0; }
  bool is_moe_layer(int64_t global_layer) const {
    return enabled() && global_layer >= 0 && global_layer < int64_t(layer_pattern.size()) &&
           layer_pattern[size_t(global_layer)];
  }
  int64_t num_moe_layers() const {
    int64_t n = 0;
    for (bool b : layer_pattern) n += b ? 1 : 0;
    return enabled() ? n : 0;
  }
  bool has_balancing(MoeBalancing type) const {
    for (const auto& t : balancing)
      if (t.type == type) return true;
    return false;
  }
};

// Megatron's name of a balancing type (the flag value).
inline const char* moe_balancing_name(MoeBalancing type) {
  switch (type) {
    case MoeBalancing::kAuxLoss: return "aux_loss";
    case MoeBalancing::kSeqAuxLoss: return "seq_aux_loss";
    case MoeBalancing::kGlobalAuxLoss: return "global_aux_loss";
    case MoeBalancing::kSinkhorn: return "sinkhorn";
    case MoeBalancing::kNone: return "none";
  }
  return "?";
}

}  // namespace fp8tron
