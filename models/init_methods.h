// Megatron's three initialisation methods (TransformerConfig.__post_init__), as standard
// deviations of the normal draw; --use-mup scales two of them by the width multiplier m:
//  - init_method: the input-side weights (QKV, fc1, MLA's projections, the router, shared-expert
//    gate, MTP's eh_proj): --init-method-std, / sqrt(m) under MuP;
//  - output_layer_init_method: the output projections of each residual branch (linear_proj,
//    fc2): --init-method-std / sqrt(2 x num_layers), / sqrt(m) under MuP;
//  - embedding_init_method: the embedding tables, and under MuP the untied output layer (without
//    MuP it takes init_method, the same unscaled value): --init-method-std.
#pragma once
#include <cmath>

#include "core/config/model_config.h"

namespace fp8tron {

inline double mup_init_divisor(const ModelConfig& m) { return m.mup.enabled ? std::sqrt(m.mup.width_mult) : 1.0; }

inline double hidden_init_std(const ModelConfig& m) { return m.init_method_std / mup_init_divisor(m); }

inline double output_layer_init_std(const ModelConfig& m) {
  return m.init_method_std / std::sqrt(2.0 * double(m.num_layers)) / mup_init_divisor(m);
}

inline double embedding_init_std(const ModelConfig& m) { return m.init_method_std; }

}  // namespace fp8tron
