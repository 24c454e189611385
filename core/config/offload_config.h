// Fine-grained activation offloading (Megatron's --fine-grained-activation-offloading,
// --offload-modules, --min-offloaded-tensor-size): the activations the named modules keep for
// their backward pass wait in host memory between the forward and the backward pass. models/
// reads this (models/recompute/activation_offload.h).
#pragma once
#include <cstdint>

namespace fp8tron {

// --offload-modules: the modules whose saved input goes to host memory.
struct OffloadModules {
  bool attn_norm = false;   // the attention's input norm (its input: the layer's residual sum)
  bool qkv_linear = false;  // the QKV projection (its input; fused with the norm: the same sum)
  bool core_attn = false;   // core attention (queries, keys, values)
  bool attn_proj = false;   // the attention's output projection (core attention's output)
  bool mlp_norm = false;    // the MLP's (or MoE layer's) input norm (its input: h = x + attention)
  bool expert_fc1 = false;  // the MoE experts' fc1 (the dispatched tokens bf16 experts keep)
  bool moe_act = false;     // the MoE experts' activation (fc1's output)
};

struct OffloadConfig {
  bool enabled = false;
  OffloadModules modules;
  int64_t min_tensor_size = 1024 * 1024;  // elements: smaller tensors stay on the device

  bool on(bool OffloadModules::*module) const { return enabled && modules.*module; }
};

}  // namespace fp8tron
