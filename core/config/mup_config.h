// Maximal Update Parametrization (--use-mup), as Megatron-Core's TransformerConfig derives it:
// the width multiplier m = hidden size / --mup-base-hidden-size scales the initialisation, the
// attention softmax, the logits and (optim/param_groups.h) the optimizer's per-parameter learning
// rates and Adam epsilon, so hyperparameters tuned at the base width transfer to wider models.
#pragma once
#include <cstdint>
#include <optional>

namespace fp8tron {

struct MupConfig {
  bool enabled = false;              // --use-mup
  int64_t base_hidden_size = 0;      // --mup-base-hidden-size (default: the hidden size, m = 1)
  double width_mult = 1.0;           // derived: hidden size / base hidden size
  double embedding_mult = 1.0;       // --mup-embedding-mult: the embedding output times this
  // --mup-output-mult: the logits times this; left at 1 with m != 1 it becomes 1 / m (Megatron).
  double output_mult = 1.0;
  std::optional<double> base_head_dim;  // --mup-base-head-dim
  double attn_scale_power = 1.0;        // --mup-attn-scale-power
  // Derived: the attention softmax scale sqrt(base head dim, or 1) / kv_channels^power, in place
  // of 1 / sqrt(kv_channels) (standard attention only: multi-latent attention keeps its own).
  std::optional<double> softmax_scale;
};

}  // namespace fp8tron
