#include "checkpoint/model_identity.h"

#include <algorithm>

#include "core/error.h"
#include "core/log.h"
#include "core/text.h"

namespace fp8tron {
namespace ck = checkpoint;

namespace {
// The MoE layers as a 0/1 string ("none" in a dense model).
std::string moe_layers(const MoeConfig& m) {
  if (!m.enabled()) return "none";
  std::string s;
  for (bool b : m.layer_pattern) s += b ? '1' : '0';
  return s;
}
}  // namespace

std::vector<ModelField> model_fields(const ModelConfig& m) {
  auto b = [](bool v) { return std::string(v ? "true" : "false"); };
  auto i = [](int64_t v) { return std::to_string(v); };
  const bool learned = m.position_embedding == PositionEmbedding::LearnedAbsolute;
  const char* positions = learned ? "learned_absolute"
                          : m.position_embedding == PositionEmbedding::Rope ? "rope"
                          : m.position_embedding == PositionEmbedding::Yarn ? "yarn" : "none";
  std::vector<ModelField> fields = {
      {"num_layers", i(m.num_layers), "--num-layers"},
      {"hidden_size", i(m.hidden_size), "--hidden-size"},
      {"ffn_hidden_size", i(m.ffn_hidden_size), "--ffn-hidden-size"},
      {"num_attention_heads", i(m.num_attention_heads), "--num-attention-heads"},
      {"kv_channels", i(m.kv_channels), "--kv-channels"},
      {"num_query_groups", i(m.num_query_groups), "--num-query-groups"},
      {"vocab_size", i(m.vocab_size), "--vocab-size or the tokenizer"},
      {"padded_vocab_size", i(m.padded_vocab_size),
       "--make-vocab-size-divisible-by x --tensor-model-parallel-size pads the vocabulary"},
      {"position_embedding_type", positions, "--position-embedding-type"},
      {"max_position_embeddings", learned ? i(m.max_position_embeddings) : "none", "--max-position-embeddings"},
      {"normalization", m.normalization == Normalization::RMSNorm ? "RMSNorm" : "LayerNorm", "--normalization"},
      {"apply_layernorm_1p", b(m.apply_layernorm_1p), "--apply-layernorm-1p"},
      {"swiglu", b(m.swiglu), "--swiglu"},
      {"add_bias_linear", b(m.add_bias_linear), "--disable-bias-linear"},
      {"add_qkv_bias", b(m.add_qkv_bias), "--add-qkv-bias"},
      {"untie_embeddings_and_output_weights", b(m.untie_embeddings_and_output_weights),
       "--untie-embeddings-and-output-weights"},
      {"qk_layernorm", b(m.qk_layernorm), "--qk-layernorm"},
      {"num_experts", i(m.moe.num_experts), "--num-experts"},
      {"moe_ffn_hidden_size", m.moe.enabled() ? i(m.moe.ffn_hidden_size) : "none", "--moe-ffn-hidden-size"},
      {"moe_layer_freq", moe_layers(m.moe), "--moe-layer-freq"},
      {"moe_shared_expert_intermediate_size", i(m.moe.shared_expert_size), "--moe-shared-expert-intermediate-size"},
      {"moe_shared_expert_gate", b(m.moe.shared_expert_gate), "--moe-shared-expert-gate"},
      {"moe_router_enable_expert_bias", b(m.moe.enable_expert_bias), "--moe-router-enable-expert-bias"},
  };
  // Model variants: recorded only when used, so checkpoints without them keep loading.
  if (m.squared_relu) fields.push_back({"squared_relu", "true", "--squared-relu"});
  if (m.attention_output_gate) fields.push_back({"attention_output_gate", "true", "--attention-output-gate"});
  if (m.mla.enabled) {
    const auto& a = m.mla;
    fields.push_back({"multi_latent_attention", "true", "--multi-latent-attention"});
    fields.push_back({"q_lora_rank", a.q_lora_rank ? i(*a.q_lora_rank) : "none", "--q-lora-rank"});
    fields.push_back({"kv_lora_rank", i(a.kv_lora_rank), "--kv-lora-rank"});
    fields.push_back({"qk_head_dim", i(a.qk_head_dim), "--qk-head-dim"});
    fields.push_back({"qk_pos_emb_head_dim", i(a.qk_pos_emb_head_dim), "--qk-pos-emb-head-dim"});
    fields.push_back({"v_head_dim", i(a.v_head_dim), "--v-head-dim"});
  }
  if (m.mtp.num_layers > 0) fields.push_back({"mtp_num_layers", i(m.mtp.num_layers), "--mtp-num-layers"});
  if (m.mup.enabled) {
    // MuP's multipliers are part of the function the weights compute.
    auto d = [](double v) { return strprintf("%.17g", v); };
    fields.push_back({"use_mup", "true", "--use-mup"});
    fields.push_back({"mup_width_mult", d(m.mup.width_mult), "--hidden-size / --mup-base-hidden-size"});
    fields.push_back({"mup_embedding_mult", d(m.mup.embedding_mult), "--mup-embedding-mult"});
    fields.push_back({"mup_output_mult", d(m.mup.output_mult), "--mup-output-mult"});
    fields.push_back({"mup_softmax_scale", d(m.mup.softmax_scale.value_or(0.0)), "--mup-base-head-dim, --mup-attn-scale-power"});
  }
  return fields;
}

void check_model(const ck::CheckpointMetadata& m, const Config& c, const std::string& path) {
  std::vector<std::string> differences;
  for (const auto& f : model_fields(c.model)) {
    auto it = m.args.find("model." + f.key);
    if (it == m.args.end() || it->second == f.value) continue;
    if (f.key == "padded_vocab_size") {
      // Only padding differs (the vocabulary itself is checked on its own): the load trims or pads
      // the embedding and output rows.
      log::info(" > the checkpoint pads the vocabulary to " + it->second + " rows, this run to " + f.value +
                " (--make-vocab-size-divisible-by x tensor-parallel size): the embedding and output-layer rows past "
                "the vocabulary are trimmed or padded on load");
      continue;
    }
    differences.push_back(strprintf("%s is %s in the checkpoint but %s here (%s)", f.key.c_str(), it->second.c_str(),
                                    f.value.c_str(), f.flags.c_str()));
  }
  // Variants recorded only when used: present in the checkpoint but not in this run's model.
  const auto here = model_fields(c.model);
  for (const auto& [key, flag] : std::vector<std::pair<std::string, std::string>>{
           {"squared_relu", "--squared-relu"}, {"multi_latent_attention", "--multi-latent-attention"},
           {"mtp_num_layers", "--mtp-num-layers"}, {"use_mup", "--use-mup"}}) {
    auto it = m.args.find("model." + key);
    const bool used_here = std::any_of(here.begin(), here.end(), [&](const ModelField& f) { return f.key == key; });
    if (it != m.args.end() && !used_here)
      differences.push_back(strprintf("%s is %s in the checkpoint but off here (%s)", key.c_str(), it->second.c_str(), flag.c_str()));
  }
  if (!differences.empty())
    throw UserError("checkpoint " + path + " was saved from a different model: " + join(differences, "; "));
}

ck::ParallelLayout layout_of(const TrainingState& s) {
  const ParallelSizes& z = s.parallel.sizes;
  ck::ParallelLayout l;
  l.tp = z.tp;
  l.pp = z.pp;
  l.dp = z.dp;
  l.cp = z.cp;
  l.ep = z.ep;
  l.etp = z.etp;
  l.vpp = s.config.distributed.virtual_stages;
  l.world_size = z.world_size;
  return l;
}

std::string layout_string(const ck::ParallelLayout& l) {
  std::string s = strprintf("(TP, PP, DP) = (%d, %d, %d)", l.tp, l.pp, l.dp);
  if (l.ep > 1 || l.etp != l.tp) s += strprintf(" with experts (EP, ETP) = (%d, %d)", l.ep, l.etp);
  if (l.vpp > 1) s += strprintf(" with %d virtual stages", l.vpp);
  return s;
}

}  // namespace fp8tron
