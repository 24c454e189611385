#include "trainer/cli/moe_args.h"

#include "core/error.h"
#include "core/text.h"
#include "trainer/cli/moe_layer_freq.h"

namespace fp8tron {
namespace {

MoeBalancing parse_balancing(const std::string& v) {
  if (v == "aux_loss") return MoeBalancing::kAuxLoss;
  if (v == "seq_aux_loss") return MoeBalancing::kSeqAuxLoss;
  if (v == "global_aux_loss") return MoeBalancing::kGlobalAuxLoss;
  if (v == "sinkhorn") return MoeBalancing::kSinkhorn;
  if (v == "none") return MoeBalancing::kNone;
  // Megatron's other balancing types are out of fp8tron's scope: refused by name, not ignored.
  throw UserError("--moe-router-load-balancing-type " + v +
                  " is not supported by fp8tron (use aux_loss, seq_aux_loss, global_aux_loss, sinkhorn or none)");
}

// Types and coefficients, paired as Megatron pairs them.
void build_balancing(const FlagValues& f, MoeConfig& moe) {
  std::vector<std::string> types = f.get_list("moe-router-load-balancing-type");
  if (types.empty()) types = {"aux_loss"};
  std::vector<double> coeffs;
  for (const auto& c : f.get_list("moe-aux-loss-coeff")) coeffs.push_back(std::stod(c));
  if (coeffs.empty()) coeffs = {0.0};
  moe.balancing_is_list = types.size() > 1;
  if (moe.balancing_is_list && coeffs.size() != types.size())
    throw UserError(strprintf("--moe-aux-loss-coeff must give one coefficient per --moe-router-load-balancing-type "
                              "(%zu types, %zu coefficients)",
                              types.size(), coeffs.size()));
  if (!moe.balancing_is_list && coeffs.size() != 1)
    throw UserError("--moe-aux-loss-coeff: one --moe-router-load-balancing-type takes one coefficient");
  moe.balancing.clear();
  for (size_t i = 0; i < types.size(); ++i) moe.balancing.push_back({parse_balancing(types[i]), coeffs[i]});
}

MoeRouterDtype parse_router_dtype(const std::string& v) {
  if (v == "fp32") return MoeRouterDtype::kFp32;
  if (v == "fp64") return MoeRouterDtype::kFp64;
  return MoeRouterDtype::kInput;
}

}  // namespace

MoeConfig build_moe_config(const FlagValues& f, const ModelConfig& m, std::vector<std::string>& notices) {
  MoeConfig moe;
  const auto experts = f.opt_int("num-experts");
  if (experts && *experts < 0) throw UserError("--num-experts must not be negative (0 or unset: a dense model)");
  moe.num_experts = experts.value_or(0);  // Megatron turns 0 into None
  const auto moe_ffn = f.opt_int("moe-ffn-hidden-size");
  if (!moe.enabled()) {
    if (moe_ffn) {
      // Megatron: ignored when --moe-layer-freq leaves dense layers, an error otherwise.
      const auto pattern = parse_moe_layer_freq(f.get_string("moe-layer-freq"), m.num_layers);
      bool dense_layers = false;
      for (bool b : pattern) dense_layers = dense_layers || !b;
      if (!dense_layers) throw UserError("--moe-ffn-hidden-size needs --num-experts (or remove --moe-ffn-hidden-size)");
      notices.push_back("--moe-ffn-hidden-size is ignored without --num-experts");
    }
    return moe;
  }
  moe.layer_pattern = parse_moe_layer_freq(f.get_string("moe-layer-freq"), m.num_layers);
  if (moe_ffn) {
    moe.ffn_hidden_size = *moe_ffn;
  } else {
    moe.ffn_hidden_size = m.ffn_hidden_size;
    notices.push_back("--moe-ffn-hidden-size is not set, using --ffn-hidden-size (" + std::to_string(m.ffn_hidden_size) +
                      ") for the experts");
  }
  moe.topk = f.get_int("moe-router-topk");
  const std::string score = f.get_string("moe-router-score-function");
  moe.score_function = score == "sigmoid"       ? MoeScoreFunction::kSigmoid
                       : score == "sqrtsoftplus" ? MoeScoreFunction::kSqrtSoftplus
                                                 : MoeScoreFunction::kSoftmax;
  moe.pre_softmax = f.get_bool("moe-router-pre-softmax");
  moe.topk_scaling_factor = f.opt_float("moe-router-topk-scaling-factor");
  moe.router_dtype = parse_router_dtype(f.get_string("moe-router-dtype"));
  build_balancing(f, moe);
  moe.z_loss_coeff = f.opt_float("moe-z-loss-coeff");
  moe.input_jitter_eps = f.opt_float("moe-input-jitter-eps");
  moe.force_load_balancing = f.get_bool("moe-router-force-load-balancing");
  moe.enable_expert_bias = f.get_bool("moe-router-enable-expert-bias");
  moe.bias_update_rate = f.get_float("moe-router-bias-update-rate");
  moe.num_groups = f.opt_int("moe-router-num-groups");
  moe.group_topk = f.opt_int("moe-router-group-topk");
  if (auto shared = f.opt_int("moe-shared-expert-intermediate-size")) {
    if (*shared <= 0)
      throw UserError("--moe-shared-expert-intermediate-size must be positive (number of shared experts x the FFN "
                      "size of each)");
    moe.shared_expert_size = *shared;
  }
  moe.shared_expert_gate = f.get_bool("moe-shared-expert-gate");
  moe.shared_expert_overlap = f.get_bool("moe-shared-expert-overlap");
  moe.overlap_expert_parallel_comm = f.get_bool("overlap-moe-expert-parallel-comm");
  moe.delay_wgrad_compute = f.get_bool("delay-wgrad-compute");
  moe.capacity_factor = f.opt_float("moe-expert-capacity-factor");
  if (moe.capacity_factor && *moe.capacity_factor < 0) moe.capacity_factor.reset();  // Megatron: negative = dropless
  moe.pad_to_capacity = f.get_bool("moe-pad-expert-input-to-capacity");
  moe.drop_policy = f.get_string("moe-token-drop-policy") == "position" ? MoeDropPolicy::kPosition : MoeDropPolicy::kProbs;
  moe.router_padding_for_quantization = f.get_bool("moe-router-padding-for-quantization");
  if (f.get_bool("moe-router-padding-for-fp8")) {
    notices.push_back("--moe-router-padding-for-fp8 is deprecated; it sets --moe-router-padding-for-quantization");
    moe.router_padding_for_quantization = true;
  }
  moe.per_layer_logging = f.get_bool("moe-per-layer-logging");
  moe.dispatcher = f.get_string("moe-token-dispatcher-type") == "alltoall" ? MoeDispatcher::kAllToAll
                                                                            : MoeDispatcher::kAllGather;
  moe.dispatch_fp8 = f.get_bool("moe-dispatch-fp8");
  return moe;
}

}  // namespace fp8tron
