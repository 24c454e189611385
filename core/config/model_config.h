// The model's shape and math (--num-layers, --hidden-size, --swiglu, ...): what models/ builds.
#pragma once
#include <cstdint>

#include "core/config/model_variants.h"
#include "core/config/moe_config.h"
#include "core/config/mup_config.h"
#include "core/config/offload_config.h"
#include "core/config/precision_config.h"
#include "core/config/recompute_config.h"

namespace fp8tron {

enum class PositionEmbedding { LearnedAbsolute, Rope, Yarn, None };
enum class Normalization { LayerNorm, RMSNorm };

struct ModelConfig {
  int64_t num_layers = 0;
  int64_t hidden_size = 0;
  int64_t ffn_hidden_size = 0;
  int64_t num_attention_heads = 0;
  int64_t kv_channels = 0;        // per-head dimension
  int64_t num_query_groups = 0;   // == num_attention_heads without GQA
  int64_t seq_length = 0;
  int64_t max_position_embeddings = 0;
  PositionEmbedding position_embedding = PositionEmbedding::LearnedAbsolute;
  double rotary_base = 10000;
  double rotary_percent = 1.0;
  Normalization normalization = Normalization::LayerNorm;
  double norm_epsilon = 1e-5;
  bool apply_layernorm_1p = false;
  bool swiglu = false;
  bool add_bias_linear = true;
  bool add_qkv_bias = true;
  bool untie_embeddings_and_output_weights = false;
  double init_method_std = 0.02;
  double attention_dropout = 0.1;
  double hidden_dropout = 0.1;
  int64_t vocab_size = 0;         // the tokenizer's
  int64_t padded_vocab_size = 0;  // padded as Megatron pads it
  bool qk_layernorm = false;
  // --attention-output-gate: the attention output times sigmoid(gate), the gate one more head-sized
  // slice per query head from linear_qkv (Megatron's layout per query group: q, gate, k, v).
  bool attention_output_gate = false;
  bool attention_softmax_in_fp32 = false;
  bool transformer_engine_modules = true;  // --transformer-impl
  ParamDtype params_dtype = ParamDtype::Fp32;
  uint64_t seed = 1234;  // initialisation seed
  RecomputeConfig recompute;  // --recompute-*
  OffloadConfig offload;      // --fine-grained-activation-offloading, --offload-modules
  bool squared_relu = false;  // --squared-relu: relu(x)^2 instead of GeLU
  bool bias_gelu_fusion = true;  // off with --no-bias-gelu-fusion: bf16 GeLU (and fc1's bias) outside the GEMMs
  RotaryConfig rotary;        // rotary-embedding variants
  MlaConfig mla;              // multi-latent attention
  MtpConfig mtp;              // multi-token prediction
  MoeConfig moe;         // mixture of experts (off: a dense model)
  MupConfig mup;         // maximal update parametrization (--use-mup)
};

// Whether the MTP layers' inner transformer layer is an MoE layer, as Megatron builds it
// (gpt_builders.py): it takes the spec of the decoder's last layer, so an MoE layer exactly when
// --moe-layer-freq makes the last decoder layer one; but a pipeline chunk holding the MTP layers
// without any decoder layer falls back to the default layer spec, which in an MoE model is the
// MoE layer whatever the pattern says.
inline bool mtp_layers_are_moe(const ModelConfig& m, bool chunk_has_decoder_layers) {
  if (m.mtp.num_layers == 0 || !m.moe.enabled()) return false;
  return !chunk_has_decoder_layers || m.moe.is_moe_layer(m.num_layers - 1);
}

// The number of MoE layers Megatron divides the logged auxiliary losses by (training.py's
// training_log): the pattern's MoE layers, plus the MTP layers when the last decoder layer is an
// MoE layer (the pattern decides here, not the pipeline chunk).
inline int64_t logged_moe_layers(const ModelConfig& m) {
  const bool mtp_moe = m.mtp.num_layers > 0 && m.moe.is_moe_layer(m.num_layers - 1);
  return m.moe.num_moe_layers() + (mtp_moe ? m.mtp.num_layers : 0);
}

// MoE metrics are recorded per layer: the decoder's layers, then the MTP layers (Megatron's
// router records MTP depth k at num_layers + k).
inline int64_t moe_metric_layers(const ModelConfig& m) { return m.num_layers + m.mtp.num_layers; }

}  // namespace fp8tron
