#include "trainer/cli/model_variant_args.h"

#include "core/error.h"

namespace fp8tron {

PositionEmbedding parse_position_embedding(const std::string& value) {
  if (value == "rope") return PositionEmbedding::Rope;
  if (value == "yarn") return PositionEmbedding::Yarn;
  if (value == "none") return PositionEmbedding::None;
  if (value == "learned_absolute") return PositionEmbedding::LearnedAbsolute;
  throw UserError("--position-embedding-type " + value + " is not supported by fp8tron (" +
                  (value == "mrope" ? "multimodal rotary embeddings" : "relative position buckets (T5)") +
                  " are not implemented); use learned_absolute, rope, yarn or none");
}

void build_model_variants(const FlagValues& f, ModelConfig& m) {
  m.squared_relu = f.get_bool("squared-relu");
  m.bias_gelu_fusion = !f.get_bool("no-bias-gelu-fusion");
  RotaryConfig& r = m.rotary;
  r.interleaved = f.get_bool("rotary-interleaved");
  r.llama3_scaling = f.get_bool("use-rope-scaling");
  r.llama3_factor = f.get_float("rope-scaling-factor");
  r.fused = !f.get_bool("no-rope-fusion");
  YarnConfig& y = r.yarn;
  y.scaling_factor = f.get_float("rotary-scaling-factor");
  y.mscale = f.get_float("mscale");
  y.mscale_all_dim = f.get_float("mscale-all-dim");
  // The --yarn-* flags default to None in Megatron: YarnRotaryEmbedding's defaults then apply.
  // They configure the GPT path only (multi-latent attention keeps the defaults).
  if (m.position_embedding == PositionEmbedding::Yarn) {
    y.original_max_position_embeddings = f.opt_int("yarn-original-max-position-embeddings").value_or(4096);
    y.beta_fast = f.opt_float("yarn-beta-fast").value_or(32.0);
    y.beta_slow = f.opt_float("yarn-beta-slow").value_or(1.0);
    y.correction_range_round_to_int = !f.get_bool("no-yarn-correction-range-round-to-int");
  }
  MlaConfig& a = m.mla;
  a.enabled = f.get_bool("multi-latent-attention");
  a.q_lora_rank = f.opt_int("q-lora-rank");
  a.kv_lora_rank = f.get_int("kv-lora-rank");
  a.qk_head_dim = f.get_int("qk-head-dim");
  a.qk_pos_emb_head_dim = f.get_int("qk-pos-emb-head-dim");
  a.v_head_dim = f.get_int("v-head-dim");
  const std::string rope_type = f.get_string("rope-type");
  a.yarn = rope_type.empty() ? true : rope_type == "yarn";
  if (!a.enabled && rope_type == "yarn")
    throw UserError("--rope-type yarn is for --multi-latent-attention; other attention takes --position-embedding-type yarn");
  m.mtp.num_layers = f.opt_int("mtp-num-layers").value_or(0);
  m.mtp.loss_scaling_factor = f.get_float("mtp-loss-scaling-factor");
}

}  // namespace fp8tron
