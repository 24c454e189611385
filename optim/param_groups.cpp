#include "optim/param_groups.h"

namespace fp8tron {
namespace {

// MuP's width scaling is on (Megatron returns no overrides at m = 1).
bool mup_scales(const OptimizerConfig& c) { return c.mup_width_mult && *c.mup_width_mult != 1.0; }

}  // namespace

bool applies_weight_decay(const std::string& name, int64_t dim, const OptimizerConfig& config) {
  // Megatron matches "*.bias"; fp8tron's TE names also have layer_norm_bias (1-D anyway).
  const bool exempt = dim == 1 || name.ends_with("bias");
  if (!exempt) return true;
  return config.apply_wd_to_qk_layernorm &&
         (name.find("q_layernorm.") != std::string::npos || name.find("k_layernorm.") != std::string::npos);
}

bool uses_muon(const std::string& name, int64_t dim, const OptimizerConfig& config) {
  return config.optimizer == "muon" && dim == 2 && !is_embedding_or_output(name);
}

bool is_fused_qkv(const std::string& name) { return name.ends_with("self_attention.linear_qkv.weight"); }

std::optional<double> mup_lr_mult(const OptimizerConfig& config) {
  if (!mup_scales(config)) return std::nullopt;
  return config.optimizer == "sgd" ? *config.mup_width_mult : 1.0 / *config.mup_width_mult;
}

LrGroup lr_group(const std::string& name, int64_t dim, const OptimizerConfig& config) {
  if (config.decoupled_lr && is_embedding_or_output(name)) return LrGroup::Decoupled;
  if (!mup_scales(config)) return LrGroup::Base;
  const bool vector_like = is_mup_vector_like(name, dim);
  if (config.optimizer == "sgd") return vector_like ? LrGroup::Mup : LrGroup::Base;
  // Muon's own matrices keep Muon's scaling (--muon-scale-mode); the rest of the hidden ones scale.
  return !vector_like && !uses_muon(name, dim, config) ? LrGroup::Mup : LrGroup::Base;
}

double adam_eps_mult(const std::string& name, int64_t dim, const OptimizerConfig& config) {
  if (!mup_scales(config) || config.optimizer != "adam" || is_mup_vector_like(name, dim)) return 1.0;
  return 1.0 / *config.mup_width_mult;
}

}  // namespace fp8tron
