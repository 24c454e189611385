#include "optim/param_groups.h"

namespace fp8tron {
namespace {
bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}
}  // namespace

bool applies_weight_decay(const std::string& name, int64_t dim, const OptimizerConfig& config) {
  // Megatron matches "*.bias"; fp8tron's TE names also have layer_norm_bias (1-D anyway).
  const bool exempt = dim == 1 || ends_with(name, "bias");
  if (!exempt) return true;
  return config.apply_wd_to_qk_layernorm &&
         (name.find("q_layernorm.") != std::string::npos || name.find("k_layernorm.") != std::string::npos);
}

bool is_embedding_or_output(const std::string& name) {
  return name == "embedding.word_embeddings.weight" || name == "output_layer.weight" ||
         name == "output_layer_shared.weight";
}

bool uses_muon(const std::string& name, int64_t dim, const OptimizerConfig& config) {
  return config.optimizer == "muon" && dim == 2 && !is_embedding_or_output(name);
}

bool is_fused_qkv(const std::string& name) { return ends_with(name, "self_attention.linear_qkv.weight"); }

}  // namespace fp8tron
