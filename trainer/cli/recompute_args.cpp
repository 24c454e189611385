#include "trainer/cli/recompute_args.h"

#include <set>
#include <variant>

#include "core/error.h"
#include "core/text.h"

namespace fp8tron {
namespace {

// Megatron's allowed --recompute-modules; those fp8tron has no model part for are refused below
// with Megatron's reason.
const std::set<std::string>& megatron_modules() {
  static const std::set<std::string> names = {"core_attn", "moe_act",      "layernorm", "mla_up_proj", "mlp",  "moe",
                                              "shared_experts", "gdn_norm_out", "gdp_in_proj", "gdp_qkv", "mhc"};
  return names;
}

RecomputeModules parse_modules(const std::vector<std::string>& names) {
  RecomputeModules m;
  m.core_attn = false;
  for (const auto& n : names) {
    if (!megatron_modules().count(n))
      throw UserError("--recompute-modules " + n +
                      ": not a module (choose from core_attn, mlp, layernorm, moe_act, moe, shared_experts, mla_up_proj)");
    if (n == "core_attn") m.core_attn = true;
    if (n == "mlp") m.mlp = true;
    if (n == "layernorm") m.layernorm = true;
    if (n == "moe_act") m.moe_act = true;
    if (n == "mla_up_proj") m.mla_up_proj = true;
    if (n == "moe") m.moe = true;
    if (n == "shared_experts") m.shared_experts = true;
  }
  return m;
}

}  // namespace

RecomputeConfig build_recompute_config(const FlagValues& f, std::vector<std::string>& notices) {
  RecomputeConfig r;
  const std::string granularity = f.get_string("recompute-granularity");
  if (granularity == "full") r.granularity = RecomputeGranularity::Full;
  if (granularity == "selective") r.granularity = RecomputeGranularity::Selective;
  // Megatron: --recompute-activations sets the granularity to selective, whatever was given.
  if (f.get_bool("recompute-activations")) r.granularity = RecomputeGranularity::Selective;
  const std::string method = f.get_string("recompute-method");
  if (method == "uniform") r.method = RecomputeMethod::Uniform;
  if (method == "block") r.method = RecomputeMethod::Block;
  r.num_layers = f.opt_int("recompute-num-layers").value_or(0);
  r.distribute_saved_activations = f.get_bool("distribute-saved-activations");
  if (f.given("recompute-modules")) r.modules = parse_modules(f.get_list("recompute-modules"));
  if (f.get_bool("moe-layer-recompute")) {
    // Megatron's deprecated flag: selective granularity with "moe" added to the modules.
    if (r.granularity == RecomputeGranularity::Full)
      throw UserError("do not set --moe-layer-recompute with --recompute-granularity full (as in Megatron)");
    r.granularity = RecomputeGranularity::Selective;
    r.modules.moe = true;
    notices.push_back("--moe-layer-recompute is deprecated (as in Megatron): use --recompute-granularity selective "
                      "--recompute-modules moe");
  }

  const bool off = r.granularity == RecomputeGranularity::None;
  if (off && (f.given("recompute-method") || f.given("recompute-num-layers")))
    notices.push_back("--recompute-method and --recompute-num-layers have no effect without --recompute-granularity");
  if (f.given("recompute-modules") && r.granularity != RecomputeGranularity::Selective)
    notices.push_back("--recompute-modules has no effect without --recompute-granularity selective");
  if (r.granularity == RecomputeGranularity::Selective && r.modules.core_attn)
    notices.push_back("--recompute-modules core_attn: fused attention keeps no attention matrix, only its output and "
                      "softmax statistics, so recomputing it saves little memory on GPUs (as Megatron warns)");
  if (r.granularity == RecomputeGranularity::Selective && (r.modules.moe || r.modules.shared_experts) &&
      !f.given("num-experts"))
    notices.push_back("--recompute-modules moe and shared_experts have no effect without --num-experts");
  else if (r.granularity == RecomputeGranularity::Selective && r.modules.shared_experts &&
           !f.given("moe-shared-expert-intermediate-size"))
    notices.push_back("--recompute-modules shared_experts has no effect without --moe-shared-expert-intermediate-size");
  if (r.granularity == RecomputeGranularity::Selective && r.modules.layernorm && !f.given("num-experts") &&
      !f.get_bool("multi-latent-attention"))
    notices.push_back("--recompute-modules layernorm: the input and pre-MLP norms of dense layers are fused into "
                      "linear_qkv and linear_fc1 (TELayerNormColumnParallelLinear) and have nothing to recompute, as "
                      "in Megatron with Transformer Engine (only MoE layers' pre-MLP norm and multi-latent "
                      "attention's input norm are modules of their own)");
  return r;
}

std::string recompute_problem(const Config& c, const FlagValues& f) {
  const RecomputeConfig& r = c.model.recompute;
  if (r.distribute_saved_activations) {
    if (c.parallel.tp <= 1)
      return "--distribute-saved-activations splits saved activations over the tensor-parallel ranks: it needs "
             "--tensor-model-parallel-size > 1";
    if (r.granularity != RecomputeGranularity::Full)
      return "--distribute-saved-activations applies to --recompute-granularity full only";
    if (r.method == RecomputeMethod::None)
      return "--distribute-saved-activations needs --recompute-method uniform or block";
    if (c.distributed.sequence_parallel)
      return "--distribute-saved-activations cannot be used with --sequence-parallel (the saved activations are "
             "already split over the tensor-parallel ranks)";
  }
  if (r.granularity == RecomputeGranularity::None) return "";
  if (r.granularity == RecomputeGranularity::Selective) {
    if (r.method != RecomputeMethod::None)
      return "--recompute-method is not supported with --recompute-granularity selective (it applies to full; "
             "selective recomputes every layer)";
    if (f.given("recompute-num-layers"))
      return "--recompute-num-layers must not be given with --recompute-granularity selective";
  } else {
    if (r.method == RecomputeMethod::None)
      return "--recompute-granularity full needs --recompute-method uniform or block";
    if (!f.given("recompute-num-layers"))
      return "--recompute-granularity full needs --recompute-num-layers (layers per recompute unit with uniform, "
             "recomputed layers per pipeline chunk with block)";
    if (r.num_layers < 1) return "--recompute-num-layers must be at least 1";
  }
  if (r.granularity != RecomputeGranularity::Selective) return "";
  std::set<std::string> named;
  for (const auto& n : f.get_list("recompute-modules")) named.insert(n);
  if (named.count("moe_act") && !f.get_bool("moe-grouped-gemm"))
    return "--recompute-modules moe_act is only supported with --moe-grouped-gemm";
  if (named.count("mla_up_proj") && !c.model.mla.enabled)
    return "--recompute-modules mla_up_proj is only supported with --multi-latent-attention";
  if (named.count("gdn_norm_out") || named.count("gdp_in_proj") || named.count("gdp_qkv"))
    return "--recompute-modules gdn_norm_out/gdp_in_proj/gdp_qkv need --experimental-attention-variant (gated delta "
           "net layers), which fp8tron does not have";
  if (named.count("mhc")) return "--recompute-modules mhc requires --enable-mhc-connections, which fp8tron does not have";
  if (named.count("shared_experts") && c.model.moe.shared_expert_size > 0 && c.model.moe.shared_expert_overlap)
    return "--recompute-modules shared_experts cannot work with --moe-shared-expert-overlap (as in Megatron)";
  if (c.precision.fp8.enabled() && (r.modules.moe_act || r.modules.layernorm) &&
      std::holds_alternative<fp8::DelayedScaling>(*c.precision.fp8.recipe))
    return "--recompute-modules moe_act and layernorm are not supported with --fp8-recipe delayed (Megatron: delayed "
           "scaling does not support moe_act and layernorm recompute for fp8)";
  return "";
}

}  // namespace fp8tron
