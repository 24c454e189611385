// Activation recomputation (Megatron's --recompute-* flags): which activations the forward pass
// drops and the backward pass recomputes, trading compute for memory. models/ reads this.
#pragma once
#include <cstdint>

namespace fp8tron {

enum class RecomputeGranularity {
  None,       // every activation is kept
  Full,       // whole transformer layers: only each recompute unit's input is kept
  Selective,  // the submodules named by RecomputeModules, in every layer
};

enum class RecomputeMethod {
  None,     // (selective granularity)
  Uniform,  // the chunk's layers in units of num_layers consecutive layers, each unit recomputed
  Block,    // the first num_layers layers of each model chunk recomputed, the rest kept
};

// --recompute-modules (selective granularity). Megatron's default is core_attn alone.
struct RecomputeModules {
  bool core_attn = true;   // softmax(QK^T)V (with its dropout and any context-parallel communication)
  bool mlp = false;        // a dense layer's MLP (norm, fc1, activation, fc2)
  // Output-discarding (models/recompute/output_discarding_recompute.h):
  bool layernorm = false;    // norms that are modules of their own (an MoE layer's pre-MLP norm,
                             // MLA's input norm); norms fused into a linear have none
  bool moe_act = false;      // the MoE experts' activation function
  bool mla_up_proj = false;  // MLA's query/key-value up projections and rotary embedding
  // Whole modules (models/recompute/recompute.h):
  bool moe = false;          // the whole MoE layer
  bool shared_experts = false;
};

struct RecomputeConfig {
  RecomputeGranularity granularity = RecomputeGranularity::None;
  RecomputeMethod method = RecomputeMethod::None;
  int64_t num_layers = 0;  // --recompute-num-layers (full granularity)
  // --distribute-saved-activations: each recompute unit's saved input is split over the
  // tensor-parallel ranks (it is replicated there without sequence parallelism) and all-gathered
  // before the recomputation.
  bool distribute_saved_activations = false;
  RecomputeModules modules;

  bool full() const { return granularity == RecomputeGranularity::Full; }
  bool selective(bool RecomputeModules::*module) const {
    return granularity == RecomputeGranularity::Selective && modules.*module;
  }
};

}  // namespace fp8tron
