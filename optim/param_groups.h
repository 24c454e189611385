// Which optimizer treatment each parameter gets, by Megatron's rules
// (megatron/core/optimizer/__init__.py get_standard_config_overrides, emerging_optimizers.py):
//  - weight decay: not for biases and 1-D weights (norms), unless --apply-wd-to-qk-layernorm and
//    the parameter belongs to q_layernorm / k_layernorm (matched by module name, so MLA's fused
//    q/kv norms are not affected, as in Megatron);
//  - the decoupled learning rate (--decoupled-lr): the word embedding (and a stage's copy of it)
//    and the output layer (Megatron's is_embedding_or_output_parameter);
//  - Muon (--optimizer muon): every 2-D weight that is not an embedding or output parameter; the
//    rest (1-D, embeddings, output layer) takes the scalar optimizer (Adam).
#pragma once
#include <string>

#include "core/config/training_config.h"

namespace fp8tron {

bool applies_weight_decay(const std::string& name, int64_t dim, const OptimizerConfig& config);
bool is_embedding_or_output(const std::string& name);
bool uses_muon(const std::string& name, int64_t dim, const OptimizerConfig& config);
// The fused QKV weight of standard attention (split into Q, K and V for Muon).
bool is_fused_qkv(const std::string& name);

}  // namespace fp8tron
