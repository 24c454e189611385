// Model variants beyond the plain GPT block, each a small struct of ModelConfig: rotary-embedding
// variants (Llama 3.1 frequency scaling, YaRN, interleaved pairs), multi-latent attention and
// multi-token prediction (DeepSeek-V3 style). Megatron-LM's flags and defaults.
#pragma once
#include <cstdint>
#include <optional>

namespace fp8tron {

// YaRN frequency interpolation (--position-embedding-type yarn, or multi-latent attention's
// default --rope-type yarn). With scaling_factor 1 it is plain RoPE.
struct YarnConfig {
  double scaling_factor = 1.0;                          // --rotary-scaling-factor
  int64_t original_max_position_embeddings = 4096;      // --yarn-original-max-position-embeddings
  double beta_fast = 32.0, beta_slow = 1.0;             // --yarn-beta-fast, --yarn-beta-slow
  bool correction_range_round_to_int = true;            // --[no-]yarn-correction-range-round-to-int
  double mscale = 1.0, mscale_all_dim = 0.0;            // --mscale, --mscale-all-dim
};

struct RotaryConfig {
  bool interleaved = false;           // --rotary-interleaved: dims (2i, 2i+1) rotate together
  bool llama3_scaling = false;        // --use-rope-scaling (Llama 3.1 frequency scaling)
  double llama3_factor = 8.0;         // --rope-scaling-factor
  YarnConfig yarn;
  bool fused = true;                  // off with --no-rope-fusion: the unfused chain of ops on the GPU too
};

// Multi-latent attention (--multi-latent-attention).
struct MlaConfig {
  bool enabled = false;
  std::optional<int64_t> q_lora_rank;  // --q-lora-rank (none: one query projection from the input)
  int64_t kv_lora_rank = 32;           // --kv-lora-rank
  int64_t qk_head_dim = 128;           // --qk-head-dim (the part without positions)
  int64_t qk_pos_emb_head_dim = 64;    // --qk-pos-emb-head-dim (the rotary part)
  int64_t v_head_dim = 128;            // --v-head-dim
  bool yarn = true;                    // --rope-type yarn (MLA's default) or rope
};

// Multi-token prediction (--mtp-num-layers): extra layers predicting tokens 2..D+1 ahead.
struct MtpConfig {
  int64_t num_layers = 0;            // --mtp-num-layers (0: off)
  double loss_scaling_factor = 0.1;  // --mtp-loss-scaling-factor
  // The pipeline chunk holding the MTP layers holds no decoder layer (a layout's "...|mL"); set
  // by trainer/cli from the pipeline plan. It decides the MTP layers' spec in an MoE model
  // (mtp_layers_are_moe in model_config.h).
  bool chunk_without_decoder_layers = false;
};

}  // namespace fp8tron
