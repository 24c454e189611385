#include "trainer/cli/offload_args.h"

#include <set>

#include "core/error.h"

namespace fp8tron {
namespace {

// Megatron's --offload-modules choices; fp8tron has no module for the last two.
const char* const kChoices = "attn_norm, qkv_linear, core_attn, attn_proj, mlp_norm, expert_fc1, moe_act";

OffloadModules parse_offload_modules(const std::vector<std::string>& names) {
  OffloadModules m;
  for (const auto& n : names) {
    if (n == "attn_norm") m.attn_norm = true;
    else if (n == "qkv_linear") m.qkv_linear = true;
    else if (n == "core_attn") m.core_attn = true;
    else if (n == "attn_proj") m.attn_proj = true;
    else if (n == "mlp_norm") m.mlp_norm = true;
    else if (n == "expert_fc1") m.expert_fc1 = true;
    else if (n == "moe_act") m.moe_act = true;
    else if (n == "fused_group_mlp")
      throw UserError("--offload-modules fused_group_mlp offloads Transformer Engine's op-fused grouped MLP "
                      "(--use-transformer-engine-op-fuser), which fp8tron does not have: use expert_fc1 and moe_act");
    else if (n == "gdp_qkv")
      throw UserError("--offload-modules gdp_qkv needs gated delta product layers, which fp8tron does not have");
    else
      throw UserError("--offload-modules " + n + ": not a module (choose from " + kChoices + ")");
  }
  return m;
}

}  // namespace

OffloadConfig build_offload_config(const FlagValues& f, std::vector<std::string>& notices) {
  OffloadConfig o;
  o.enabled = f.get_bool("fine-grained-activation-offloading");
  o.modules = parse_offload_modules(f.get_list("offload-modules"));
  o.min_tensor_size = f.get_int("min-offloaded-tensor-size");
  if (!o.enabled && (f.given("offload-modules") || f.given("min-offloaded-tensor-size")))
    notices.push_back("--offload-modules and --min-offloaded-tensor-size have no effect without "
                      "--fine-grained-activation-offloading");
  return o;
}

std::string offload_problem(const Config& c, const FlagValues& f) {
  const OffloadConfig& o = c.model.offload;
  if (!o.enabled) return "";
  const OffloadModules& m = o.modules;
  if (!(m.attn_norm || m.qkv_linear || m.core_attn || m.attn_proj || m.mlp_norm || m.expert_fc1 || m.moe_act))
    return std::string("--fine-grained-activation-offloading needs --offload-modules (choose from ") + kChoices + ")";
  if (!c.model.transformer_engine_modules)
    return "--fine-grained-activation-offloading is only supported with --transformer-impl transformer_engine (Megatron)";
  if (m.attn_proj && !m.core_attn)
    return "--offload-modules attn_proj cannot be set without core_attn: attn_proj's input is core_attn's output, "
           "which core_attn's backward needs (Megatron)";
  const RecomputeConfig& r = c.model.recompute;
  if (r.selective(&RecomputeModules::moe) && (m.expert_fc1 || m.moe_act))
    return "--offload-modules expert_fc1/moe_act cannot be combined with moe in --recompute-modules: the whole MoE layer "
           "is recomputed, nothing inside it is kept to offload (Megatron); drop one of them";
  if (o.min_tensor_size < 0) return "--min-offloaded-tensor-size must be non-negative";
  const double fraction = f.get_float("activation-offload-fraction");
  if (fraction < 0 || fraction > 1) return "--activation-offload-fraction must be in [0, 1]";
  if (fraction != 1.0)
    return "--activation-offload-fraction below 1 (offload only the first groups of each step) is not implemented: "
           "fp8tron offloads every eligible group; leave it at 1.0";
  const int64_t delta = f.get_int("delta-offload-bytes-across-pp-ranks");
  if (delta < 0) return "--delta-offload-bytes-across-pp-ranks must be non-negative";
  if (delta != 0)
    return "--delta-offload-bytes-across-pp-ranks (fewer offloaded bytes on later pipeline ranks) is not implemented: "
           "leave it at 0";
  if (c.training.cuda_graph.full_iteration)
    return "--fine-grained-activation-offloading cannot be combined with CUDA graphs (--cuda-graph-impl): the copies "
           "and device-memory releases run on the host between kernels; drop one of them";
  return "";
}

}  // namespace fp8tron
