#include "trainer/export/hf_model_flags.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <set>

#include "core/error.h"
#include "core/text.h"
#include "checkpoint/file_io.h"
#include "models/attention/rotary.h"

namespace fp8tron::hf {
namespace ck = checkpoint;
using nlohmann::json;

json read_json(const std::string& path) {
  if (!std::filesystem::exists(path)) throw UserError(path + " does not exist");
  try {
    return json::parse(ck::read_file(path));
  } catch (const json::exception& e) {
    throw UserError(path + ": not valid JSON (" + e.what() + ")");
  }
}

// The shortest text that reads back the same value, for readable flags (1e-05, 0.02).
std::string number_text(double v) {
  for (int digits = 1; digits < 17; ++digits) {
    std::string t = strprintf("%.*g", digits, v);
    if (std::stod(t) == v) return t;
  }
  return strprintf("%.17g", v);
}

namespace {

// config.json, with errors that name the field.
class HfConfig {
 public:
  HfConfig(json j, std::string path) : j_(std::move(j)), path_(std::move(path)) {}

  bool has(const std::string& key) const { return j_.contains(key) && !j_[key].is_null(); }
  const json& at(const std::string& key) const {
    if (!has(key)) throw UserError(path_ + ": '" + key + "' is missing");
    return j_[key];
  }
  int64_t integer(const std::string& key) const {
    const json& v = at(key);
    if (!v.is_number_integer()) throw UserError(path_ + ": '" + key + "' is not an integer");
    return v.get<int64_t>();
  }
  int64_t integer_or(const std::string& key, int64_t fallback) const { return has(key) ? integer(key) : fallback; }
  double number_or(const std::string& key, double fallback) const {
    if (!has(key)) return fallback;
    if (!j_[key].is_number()) throw UserError(path_ + ": '" + key + "' is not a number");
    return j_[key].get<double>();
  }
  bool flag_or(const std::string& key, bool fallback) const {
    if (!has(key)) return fallback;
    if (!j_[key].is_boolean()) throw UserError(path_ + ": '" + key + "' is not true or false");
    return j_[key].get<bool>();
  }
  std::string string_or(const std::string& key, const std::string& fallback) const {
    if (!has(key)) return fallback;
    if (!j_[key].is_string()) throw UserError(path_ + ": '" + key + "' is not a string");
    return j_[key].get<std::string>();
  }
  [[noreturn]] void refuse(const std::string& field, const std::string& why) const {
    throw UserError(path_ + ": unsupported " + field + ": " + why);
  }
  const json& raw() const { return j_; }
  const std::string& path() const { return path_; }

 private:
  json j_;
  std::string path_;
};



void require_architecture(const HfConfig& c, const std::string& expected) {
  if (!c.has("architectures")) return;
  const json& a = c.at("architectures");
  if (!a.is_array() || a.size() != 1 || !a[0].is_string() || a[0].get<std::string>() != expected)
    c.refuse("architectures", a.dump() + " (this model_type imports from " + expected + " only)");
}

void refuse_common(const HfConfig& c) {
  if (c.has("quantization_config")) c.refuse("quantization_config", "quantized weights cannot be imported");
}

ModelFlags gpt2_flags(const HfConfig& c) {
  require_architecture(c, "GPT2LMHeadModel");
  const std::string act = c.string_or("activation_function", "gelu_new");
  ModelFlags f;
  f.format = "gpt2";
  const int64_t hidden = c.integer("n_embd");
  f.add("--num-layers", c.integer("n_layer"));
  f.add("--hidden-size", hidden);
  f.add("--ffn-hidden-size", c.integer_or("n_inner", 4 * hidden));
  f.add("--num-attention-heads", c.integer("n_head"));
  f.add("--max-position-embeddings", c.integer("n_positions"));
  f.add("--position-embedding-type", "learned_absolute");
  f.add_number("--norm-epsilon", c.number_or("layer_norm_epsilon", 1e-5));
  // fp8tron's GeLU is the tanh approximation (gelu_new); the exact erf GeLU would differ.
  if (act == "relu2") f.add("--squared-relu");
  else if (act != "gelu_new" && act != "gelu_pytorch_tanh" && act != "gelu_fast")
    c.refuse("activation_function", "'" + act + "' (fp8tron has the tanh GeLU: gelu_new, gelu_pytorch_tanh; and relu2)");
  if (c.flag_or("scale_attn_by_inverse_layer_idx", false))
    c.refuse("scale_attn_by_inverse_layer_idx", "true (fp8tron scales every layer's scores by 1/sqrt(head dim))");
  if (!c.flag_or("scale_attn_weights", true))
    c.refuse("scale_attn_weights", "false (fp8tron scales the scores by 1/sqrt(head dim))");
  if (c.flag_or("add_cross_attention", false)) c.refuse("add_cross_attention", "true (decoder-only models only)");
  if (!c.flag_or("tie_word_embeddings", true)) f.add("--untie-embeddings-and-output-weights");
  const double resid = c.number_or("resid_pdrop", 0.1), embd = c.number_or("embd_pdrop", 0.1);
  f.add_number("--hidden-dropout", resid);
  f.add_number("--attention-dropout", c.number_or("attn_pdrop", 0.1));
  if (embd != resid)
    f.notes.push_back(strprintf("embd_pdrop %g differs from resid_pdrop %g: fp8tron's embedding dropout is "
                                "--hidden-dropout (%g)", embd, resid, resid));
  f.add_number("--init-method-std", c.number_or("initializer_range", 0.02));
  f.add("--vocab-size", c.integer("vocab_size"));
  return f;
}

// rope_theta and rope_scaling, from transformers 5's rope_parameters or 4's separate fields.
void rope_flags(const HfConfig& c, ModelFlags& f) {
  json scaling = nullptr;
  double theta = 10000.0;
  std::string field = "rope_scaling";
  if (c.has("rope_parameters")) {
    field = "rope_parameters";
    scaling = c.at("rope_parameters");
    if (!scaling.is_object()) c.refuse(field, "not an object (per-layer-type rope parameters are not supported)");
    if (scaling.contains("rope_theta")) theta = scaling["rope_theta"].get<double>();
  } else {
    theta = c.number_or("rope_theta", 10000.0);
    if (c.has("rope_scaling")) scaling = c.at("rope_scaling");
  }
  // Megatron's --rotary-base is an integer.
  if (theta != std::floor(theta) || theta < 1 || theta > 1e15)
    c.refuse(field == "rope_scaling" ? "rope_theta" : field + ".rope_theta",
             number_text(theta) + " (fp8tron's --rotary-base is a whole number)");
  f.add("--rotary-base", int64_t(theta));
  if (c.number_or("partial_rotary_factor", 1.0) != 1.0)
    c.refuse("partial_rotary_factor", "the Llama classes rotate every dimension here");
  if (scaling.is_null()) return;
  const std::string type = scaling.value("rope_type", scaling.value("type", std::string("default")));
  if (type == "default") return;
  if (type != "llama3") c.refuse(field + ".rope_type", "'" + type + "' (supported: default, llama3)");
  // fp8tron's Llama 3.1 scaling has Meta's fixed low/high frequency factors and original context.
  auto expect = [&](const std::string& key, double value) {
    if (!scaling.contains(key) || scaling[key].get<double>() != value)
      c.refuse(field + "." + key, strprintf("fp8tron's llama3 scaling has %s %g", key.c_str(), value));
  };
  expect("low_freq_factor", 1.0);
  expect("high_freq_factor", 4.0);
  expect("original_max_position_embeddings", 8192);
  f.add("--use-rope-scaling");
  f.add_number("--rope-scaling-factor", scaling.value("factor", 8.0));
}

// The Llama family's shared part: attention (GQA, RoPE), RMSNorm, SwiGLU, head, dropouts. Qwen2's
// biases are on q, k and v only (qkv_bias), and its sliding window is off unless use_sliding_window.
void llama_family_flags(const HfConfig& c, ModelFlags& f, bool qwen = false) {
  const int64_t hidden = c.integer("hidden_size"), heads = c.integer("num_attention_heads");
  const int64_t groups = c.integer_or("num_key_value_heads", heads);
  const int64_t head_dim = c.integer_or("head_dim", hidden / heads);
  if (c.string_or("hidden_act", "silu") != "silu")
    c.refuse("hidden_act", "'" + c.string_or("hidden_act", "") + "' (fp8tron's SwiGLU gates with silu)");
  if (qwen) {
    if (c.flag_or("use_sliding_window", false)) c.refuse("use_sliding_window", "fp8tron's attention is full causal attention");
  } else if (c.has("sliding_window")) {
    c.refuse("sliding_window", "fp8tron's attention is full causal attention");
  }
  f.add("--num-layers", c.integer("num_hidden_layers"));
  f.add("--hidden-size", hidden);
  f.add("--ffn-hidden-size", c.integer("intermediate_size"));
  f.add("--num-attention-heads", heads);
  if (groups != heads) {
    if (groups <= 0 || heads % groups != 0)
      c.refuse("num_key_value_heads", strprintf("%lld does not divide num_attention_heads", (long long)groups));
    f.add("--group-query-attention");
    f.add("--num-query-groups", groups);
  }
  if (head_dim * heads != hidden) f.add("--kv-channels", head_dim);
  f.add("--max-position-embeddings", c.integer("max_position_embeddings"));
  f.add("--position-embedding-type", "rope");
  rope_flags(c, f);
  f.add("--normalization", "RMSNorm");
  f.add_number("--norm-epsilon", c.number_or("rms_norm_eps", 1e-6));
  f.add("--swiglu");
  if (qwen) {
    if (c.flag_or("qkv_bias", true)) f.add("--add-qkv-bias");
    f.add("--disable-bias-linear");
  }
  // Megatron's biases come together (--disable-bias-linear drops all).
  const bool attention_bias = c.flag_or("attention_bias", false), mlp_bias = c.flag_or("mlp_bias", false);
  if (attention_bias != mlp_bias)
    c.refuse(attention_bias ? "attention_bias" : "mlp_bias",
             "true while the other is false (fp8tron's linear biases are on all layers or none)");
  if (!attention_bias && !qwen) f.add("--disable-bias-linear");
  if (!c.flag_or("tie_word_embeddings", false)) f.add("--untie-embeddings-and-output-weights");
  f.add_number("--attention-dropout", c.number_or("attention_dropout", 0.0));
  f.add_number("--hidden-dropout", 0.0);  // no dropout outside attention
  f.add_number("--init-method-std", c.number_or("initializer_range", 0.02));
  f.add("--vocab-size", c.integer("vocab_size"));
}

ModelFlags llama_flags(const HfConfig& c) {
  require_architecture(c, "LlamaForCausalLM");
  ModelFlags f;
  f.format = "llama";
  llama_family_flags(c, f);
  return f;
}

// Mixtral: every layer's MLP is a dropless mixture of experts whose router takes the softmax of
// its top-k logits (softmax over all, top k, renormalised: the same weights), Megatron's default
// order (no --moe-router-pre-softmax).
ModelFlags mixtral_flags(const HfConfig& c) {
  require_architecture(c, "MixtralForCausalLM");
  if (c.number_or("router_jitter_noise", 0.0) != 0.0)
    c.refuse("router_jitter_noise", "non-zero (fp8tron's router has no multiplicative jitter)");
  ModelFlags f;
  f.format = "mixtral";
  llama_family_flags(c, f);
  f.add("--num-experts", c.integer("num_local_experts"));
  f.add("--moe-router-topk", c.integer_or("num_experts_per_tok", 2));
  f.add("--moe-ffn-hidden-size", c.integer("intermediate_size"));
  f.add("--moe-router-load-balancing-type", "aux_loss");
  f.add_number("--moe-aux-loss-coeff", c.number_or("router_aux_loss_coef", 0.001));
  return f;
}

// Qwen's per-layer attention kinds: only full attention has an fp8tron equivalent.
void refuse_windowed_layers(const HfConfig& c) {
  if (!c.has("layer_types")) return;
  for (const auto& t : c.at("layer_types"))
    if (t != "full_attention") c.refuse("layer_types", t.dump() + " (fp8tron's attention is full causal attention)");
}

// Qwen2: Llama with biases on q, k and v only.
ModelFlags qwen2_flags(const HfConfig& c) {
  require_architecture(c, "Qwen2ForCausalLM");
  refuse_windowed_layers(c);
  ModelFlags f;
  f.format = "qwen2";
  llama_family_flags(c, f, /*qwen=*/true);
  return f;
}

// Qwen2-MoE: q/k/v biases, MoE layers where (i + 1) % decoder_sparse_step == 0 and i is not in
// mlp_only_layers (the others dense, of intermediate_size), each with a shared expert behind a
// sigmoid gate. Without norm_topk_prob its router keeps the softmax over all experts of the
// chosen k (Megatron's --moe-router-pre-softmax); with it, they are renormalised (the default).
ModelFlags qwen2_moe_flags(const HfConfig& c) {
  require_architecture(c, "Qwen2MoeForCausalLM");
  refuse_windowed_layers(c);
  ModelFlags f;
  f.format = "qwen2_moe";
  llama_family_flags(c, f, /*qwen=*/true);
  const int64_t layers = c.integer("num_hidden_layers"), step = c.integer_or("decoder_sparse_step", 1);
  if (step < 1) c.refuse("decoder_sparse_step", "below 1");
  std::set<int64_t> dense;
  if (c.has("mlp_only_layers"))
    for (const auto& i : c.at("mlp_only_layers")) dense.insert(i.get<int64_t>());
  // Megatron's list expression in runs, "([1]*2+[0]*1+...)": a bare "[1,0,1]" would be split by
  // the command-line parser as a list value.
  std::string pattern;
  bool all_moe = true;
  for (int64_t i = 0; i < layers;) {
    const auto moe = [&](int64_t j) { return !dense.count(j) && (j + 1) % step == 0; };
    int64_t run = 1;
    while (i + run < layers && moe(i + run) == moe(i)) ++run;
    all_moe = all_moe && moe(i);
    pattern += strprintf("%s[%d]*%lld", i ? "+" : "", moe(i) ? 1 : 0, (long long)run);
    i += run;
  }
  f.add("--num-experts", c.integer("num_experts"));
  f.add("--moe-router-topk", c.integer_or("num_experts_per_tok", 4));
  f.add("--moe-ffn-hidden-size", c.integer("moe_intermediate_size"));
  if (!all_moe) f.add("--moe-layer-freq", "(" + pattern + ")");
  const int64_t shared = c.integer("shared_expert_intermediate_size");
  if (shared <= 0) c.refuse("shared_expert_intermediate_size", "Qwen2-MoE's shared expert needs a size");
  f.add("--moe-shared-expert-intermediate-size", shared);
  f.add("--moe-shared-expert-gate");
  if (!c.flag_or("norm_topk_prob", false)) f.add("--moe-router-pre-softmax");
  f.add("--moe-router-load-balancing-type", "aux_loss");
  f.add_number("--moe-aux-loss-coeff", c.number_or("router_aux_loss_coef", 0.001));
  return f;
}

// Multi-latent attention's rotary settings: plain RoPE, or YaRN as Megatron's MLA takes it
// (--rotary-scaling-factor, --mscale, --mscale-all-dim; the original context 4096 and betas 32 / 1
// fixed).
void mla_rope_flags(const HfConfig& c, ModelFlags& f) {
  json scaling = c.has("rope_parameters") ? c.at("rope_parameters") : c.has("rope_scaling") ? c.at("rope_scaling") : json();
  const std::string field = c.has("rope_parameters") ? "rope_parameters" : "rope_scaling";
  double theta = c.number_or("rope_theta", 10000.0);
  if (scaling.is_object() && scaling.contains("rope_theta")) theta = scaling["rope_theta"].get<double>();
  if (theta != std::floor(theta) || theta < 1 || theta > 1e15)
    c.refuse("rope_theta", number_text(theta) + " (fp8tron's --rotary-base is a whole number)");
  f.add("--rotary-base", int64_t(theta));
  const std::string type =
      scaling.is_object() ? scaling.value("rope_type", scaling.value("type", std::string("default"))) : "default";
  if (type == "default") {
    f.add("--rope-type", "rope");
    return;
  }
  if (type != "yarn") c.refuse(field + ".rope_type", "'" + type + "' (multi-latent attention takes default or yarn)");
  auto number = [&](const char* key, double fallback) {
    return scaling.contains(key) && !scaling[key].is_null() ? scaling[key].get<double>() : fallback;
  };
  auto expect = [&](const char* key, double fallback, double value) {
    if (number(key, fallback) != value)
      c.refuse(field + "." + key, strprintf("fp8tron's multi-latent attention YaRN has %s %g", key, value));
  };
  expect("original_max_position_embeddings", 4096, 4096);
  expect("beta_fast", 32, 32);
  expect("beta_slow", 1, 1);
  if (scaling.contains("truncate") && scaling["truncate"] == false)
    c.refuse(field + ".truncate", "false (fp8tron's multi-latent attention YaRN rounds the correction range)");
  const double factor = number("factor", double(c.integer("max_position_embeddings")) / 4096.0);
  const double mscale = number("mscale", 0), all_dim = number("mscale_all_dim", 0);
  // transformers' cos/sin factor (given, or inferred from mscale only when mscale_all_dim is set
  // too); its softmax scale takes mscale_all_dim, as Megatron's --mscale-all-dim. Megatron's factor
  // is yarn_mscale(factor, --mscale) / yarn_mscale(factor, --mscale-all-dim): solve for --mscale.
  const double theirs = number("attention_factor", mscale != 0 && all_dim != 0
                                                       ? yarn_mscale(factor, mscale) / yarn_mscale(factor, all_dim)
                                                       : yarn_mscale(factor, 1.0));
  RotarySpec spec;
  spec.scaling = RotaryScaling::Yarn;
  spec.yarn.scaling_factor = factor;
  spec.yarn.mscale_all_dim = all_dim;
  spec.yarn.mscale = factor > 1 ? (theirs * yarn_mscale(factor, all_dim) - 1.0) / (0.1 * std::log(factor)) : 1.0;
  // A readable --mscale where 12 digits give the same factor (1 rather than 0.9999999999999999).
  RotarySpec rounded = spec;
  rounded.yarn.mscale = std::stod(strprintf("%.12g", spec.yarn.mscale));
  if (std::abs(theirs - rotary_concentration(rounded)) <= 1e-15 * std::abs(theirs)) spec = rounded;
  if (std::abs(theirs - rotary_concentration(spec)) > 1e-9 * std::abs(theirs))
    c.refuse(field + ".attention_factor",
             strprintf("%g with factor %g: Megatron's YaRN has no cos/sin factor there", theirs, factor));
  f.add("--rope-type", "yarn");
  f.add_number("--rotary-scaling-factor", factor);
  f.add_number("--mscale", spec.yarn.mscale);
  f.add_number("--mscale-all-dim", spec.yarn.mscale_all_dim);
}

// DeepSeek-V3's mixture of experts (DeepseekV3MoE): first_k_dense_replace dense layers, then MoE
// layers whose sigmoid router selects on score + e_score_correction_bias (Megatron's expert
// bias) within the topk_group best of n_group groups, a group scored by its top-2 (fp8tron's
// --moe-router-topk / --moe-router-group-topk, so that ratio must be 2), weighs by the unbiased
// scores renormalised over k (norm_topk_prob) times routed_scaling_factor; n_shared_experts
// ungated shared experts. Training follows Megatron's DeepSeek-V3 recipe (seq_aux_loss 1e-4,
// fp32 router, bias update rate 1e-3).
void deepseek_moe_flags(const HfConfig& c, ModelFlags& f) {
  const int64_t layers = c.integer("num_hidden_layers"), experts = c.integer_or("n_routed_experts", 0);
  const int64_t dense = std::min(c.integer_or("first_k_dense_replace", 0), layers);
  if (experts <= 0 || dense == layers) return;  // a dense model
  const int64_t topk = c.integer("num_experts_per_tok"), moe_ffn = c.integer("moe_intermediate_size");
  f.add("--num-experts", experts);
  f.add("--moe-router-topk", topk);
  f.add("--moe-ffn-hidden-size", moe_ffn);
  if (dense > 0) f.add("--moe-layer-freq", strprintf("([0]*%lld+[1]*%lld)", (long long)dense, (long long)(layers - dense)));
  const int64_t shared = c.integer_or("n_shared_experts", 0);
  if (shared <= 0) c.refuse("n_shared_experts", "DeepseekV3MoE without shared experts has no fp8tron equivalent here");
  f.add("--moe-shared-expert-intermediate-size", shared * moe_ffn);
  f.add("--moe-router-score-function", "sigmoid");
  f.add("--moe-router-enable-expert-bias");
  const int64_t groups = c.integer_or("n_group", 1), group_topk = c.integer_or("topk_group", 1);
  if (groups < 1 || experts % groups != 0) c.refuse("n_group", "must divide n_routed_experts");
  if (experts / groups < 2) c.refuse("n_group", "transformers scores each group by its top 2 experts: groups need 2 or more");
  if (group_topk < groups) {  // else every group is kept: plain top-k
    if (group_topk < 1 || topk / group_topk != 2)
      c.refuse("topk_group", strprintf("%lld with num_experts_per_tok %lld: transformers scores a group by the sum of "
                                       "its top 2, fp8tron by its top (num_experts_per_tok / topk_group), so that ratio must be 2",
                                       (long long)group_topk, (long long)topk));
    f.add("--moe-router-num-groups", groups);
    f.add("--moe-router-group-topk", group_topk);
  }
  // fp8tron's sigmoid router renormalises over k > 1 (Megatron's), never over one.
  if (c.flag_or("norm_topk_prob", true) != (topk > 1))
    c.refuse("norm_topk_prob", strprintf("%s with num_experts_per_tok %lld (fp8tron's sigmoid router renormalises "
                                         "exactly when more than one expert is chosen)",
                                         topk > 1 ? "false" : "true", (long long)topk));
  const double scale = c.number_or("routed_scaling_factor", 1.0);
  if (scale != 1.0) f.add_number("--moe-router-topk-scaling-factor", scale);
  f.add("--moe-router-load-balancing-type", "seq_aux_loss");
  f.add_number("--moe-aux-loss-coeff", 1e-4);
  f.add("--moe-router-dtype", "fp32");
}

// DeepSeek-V3: multi-latent attention (a query bottleneck unless q_lora_rank is null, the q and
// kv latent norms as --qk-layernorm), RMSNorm, SwiGLU, dense then MoE layers.
ModelFlags deepseek_v3_flags(const HfConfig& c) {
  require_architecture(c, "DeepseekV3ForCausalLM");
  if (c.string_or("hidden_act", "silu") != "silu")
    c.refuse("hidden_act", "'" + c.string_or("hidden_act", "") + "' (fp8tron's SwiGLU gates with silu)");
  if (c.flag_or("attention_bias", false)) c.refuse("attention_bias", "true (fp8tron's multi-latent attention has no biases)");
  ModelFlags f;
  f.format = "deepseek_v3";
  f.add("--num-layers", c.integer("num_hidden_layers"));
  f.add("--hidden-size", c.integer("hidden_size"));
  f.add("--ffn-hidden-size", c.integer("intermediate_size"));
  f.add("--num-attention-heads", c.integer("num_attention_heads"));
  f.add("--max-position-embeddings", c.integer("max_position_embeddings"));
  f.add("--position-embedding-type", "rope");
  f.add("--multi-latent-attention");
  if (c.has("q_lora_rank")) f.add("--q-lora-rank", c.integer("q_lora_rank"));
  f.add("--kv-lora-rank", c.integer("kv_lora_rank"));
  f.add("--qk-head-dim", c.integer("qk_nope_head_dim"));
  f.add("--qk-pos-emb-head-dim", c.integer("qk_rope_head_dim"));
  f.add("--v-head-dim", c.integer("v_head_dim"));
  f.add("--qk-layernorm");
  mla_rope_flags(c, f);
  const double eps = c.number_or("rms_norm_eps", 1e-6);
  f.add("--normalization", "RMSNorm");
  f.add_number("--norm-epsilon", eps);
  // transformers builds the latent norms with eps 1e-6 whatever rms_norm_eps says; fp8tron's take --norm-epsilon.
  if (std::abs(eps - 1e-6) > 1e-9)
    f.notes.push_back(strprintf("rms_norm_eps is %g but transformers' q_a_layernorm and kv_a_layernorm use 1e-6; "
                                "fp8tron's take --norm-epsilon, so the logits differ slightly", eps));
  f.add("--swiglu");
  f.add("--disable-bias-linear");
  if (!c.flag_or("tie_word_embeddings", false)) f.add("--untie-embeddings-and-output-weights");
  f.add_number("--attention-dropout", c.number_or("attention_dropout", 0.0));
  f.add_number("--hidden-dropout", 0.0);
  f.add_number("--init-method-std", c.number_or("initializer_range", 0.02));
  f.add("--vocab-size", c.integer("vocab_size"));
  deepseek_moe_flags(c, f);
  return f;
}

}  // namespace

ModelFlags model_flags(const std::string& hf_dir) {
  const std::string path = hf_dir + "/config.json";
  const HfConfig c(read_json(path), path);
  refuse_common(c);
  const std::string type = c.string_or("model_type", "");
  if (type == "gpt2") return gpt2_flags(c);
  if (type == "llama") return llama_flags(c);
  if (type == "mixtral") return mixtral_flags(c);
  if (type == "qwen2") return qwen2_flags(c);
  if (type == "qwen2_moe") return qwen2_moe_flags(c);
  if (type == "deepseek_v3") return deepseek_v3_flags(c);
  c.refuse("model_type", "'" + type + "' (supported: gpt2, llama, qwen2, mixtral, qwen2_moe, deepseek_v3)");
}

}  // namespace fp8tron::hf
