// Which optimizer treatment each parameter gets, by Megatron's rules
// (megatron/core/optimizer/__init__.py get_standard_config_overrides, get_mup_config_overrides,
// emerging_optimizers.py):
//  - weight decay: not for biases and 1-D weights (norms), unless --apply-wd-to-qk-layernorm and
//    the parameter belongs to q_layernorm / k_layernorm (matched by module name, so MLA's fused
//    q/kv norms are not affected, as in Megatron);
//  - the decoupled learning rate (--decoupled-lr): the word embedding (and a stage's copy of it)
//    and the output layer (Megatron's is_embedding_or_output_parameter);
//  - Muon (--optimizer muon): every 2-D weight that is not an embedding or output parameter; the
//    rest (1-D, embeddings, output layer) takes the scalar optimizer (Adam);
//  - MuP (--use-mup, width multiplier m != 1): "vector-like" parameters are the embedding class
//    (every embedding table, its pipeline copies and the output layer) and every parameter of at
//    most one dimension; the others are "hidden" (matrix-like). Adam: hidden learning rate (peak
//    and minimum) / m and hidden epsilon / m. SGD: vector-like learning rate x m. Muon: the hidden
//    parameters Muon does not itself update get learning rate / m, no epsilon change. With
//    --decoupled-lr the embedding and output layer keep their decoupled learning rate.
#pragma once
#include <optional>
#include <string>

#include "core/config/training_config.h"
#include "core/param_roles.h"  // is_embedding_or_output, is_mup_vector_like

namespace fp8tron {

bool applies_weight_decay(const std::string& name, int64_t dim, const OptimizerConfig& config);
bool uses_muon(const std::string& name, int64_t dim, const OptimizerConfig& config);
// The fused QKV weight of standard attention (split into Q, K and V for Muon).
bool is_fused_qkv(const std::string& name);

// The learning-rate schedule a parameter follows: every group shares the schedule's shape, each
// with its own peak and minimum (Megatron's per-group max_lr / min_lr).
enum class LrGroup { Base = 0, Decoupled = 1, Mup = 2 };
LrGroup lr_group(const std::string& name, int64_t dim, const OptimizerConfig& config);

// MuP: the factor on the Mup group's peak and minimum learning rate (1 / m, or m for SGD); none
// without --use-mup or at m = 1 (Megatron then adds no override).
std::optional<double> mup_lr_mult(const OptimizerConfig& config);
// The factor on --adam-eps for this parameter (1 / m for MuP's hidden parameters under Adam).
double adam_eps_mult(const std::string& name, int64_t dim, const OptimizerConfig& config);

// The learning rates of the groups besides the base one at a step; unset: the base rate.
struct GroupLrs {
  std::optional<double> decoupled;  // --decoupled-lr's group
  std::optional<double> mup;        // MuP's width-scaled group
};

}  // namespace fp8tron
