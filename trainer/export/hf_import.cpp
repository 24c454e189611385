#include "trainer/export/hf_import.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <unistd.h>

#include "core/error.h"
#include "core/text.h"
#include "core/version.h"
#include "checkpoint/checkpoint_dir.h"
#include "checkpoint/file_io.h"
#include "checkpoint/metadata.h"
#include "checkpoint/model_identity.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/saved_tensors.h"
#include "checkpoint/sharded_io.h"
#include "models/attention/rotary.h"
#include "models/gpt_model.h"
#include "trainer/cli/config_builder.h"
#include "trainer/cli/flags.h"
#include "trainer/export/hf_layout.h"

namespace fp8tron {
namespace {
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

// The shortest text that reads back the same value, for readable flags (1e-05, 0.02).
std::string number_text(double v) {
  for (int digits = 1; digits < 17; ++digits) {
    std::string t = strprintf("%.*g", digits, v);
    if (std::stod(t) == v) return t;
  }
  return strprintf("%.17g", v);
}

// The model's flags, the format and notes, from config.json.
struct ModelFlags {
  std::string format;
  std::vector<std::string> flags;
  std::vector<std::string> notes;
  void add(const std::string& flag) { flags.push_back(flag); }
  void add(const std::string& flag, const std::string& value) {
    flags.push_back(flag);
    flags.push_back(value);
  }
  void add(const std::string& flag, int64_t value) { add(flag, std::to_string(value)); }
  void add_number(const std::string& flag, double value) { add(flag, number_text(value)); }
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

// The Hugging Face tensors by name, from model.safetensors or the shards its index lists.
class HfTensors {
 public:
  explicit HfTensors(const std::string& dir) {
    const std::string single = dir + "/model.safetensors", index = dir + "/model.safetensors.index.json";
    std::vector<std::string> files;
    if (std::filesystem::exists(index)) {
      const json j = read_json(index);
      if (!j.contains("weight_map") || !j["weight_map"].is_object()) throw UserError(index + ": no 'weight_map'");
      std::set<std::string> unique;
      for (const auto& [name, file] : j["weight_map"].items()) unique.insert(file.get<std::string>());
      files.assign(unique.begin(), unique.end());
    } else if (std::filesystem::exists(single)) {
      files.push_back("model.safetensors");
    } else {
      throw UserError(dir + " holds neither model.safetensors nor model.safetensors.index.json (only safetensors "
                            "weights are read: save with safe_serialization)");
    }
    for (const auto& f : files) {
      if (f.find('/') != std::string::npos) throw UserError(index + ": shard '" + f + "' is not in the directory");
      files_.push_back(std::make_unique<ck::SafetensorsFile>(ck::SafetensorsFile::open(dir + "/" + f)));
      for (const auto& view : files_.back()->tensors()) {
        if (!views_.emplace(view.name, &view).second)
          throw UserError(dir + ": tensor " + view.name + " is stored twice (in " + f + " and another shard)");
      }
    }
  }

  bool has(const std::string& name) const { return views_.count(name) != 0; }

  // An fp32 copy of `name`; each tensor may be taken once (what remains is reported).
  torch::Tensor take(const std::string& name) {
    auto it = views_.find(name);
    if (it == views_.end()) throw UserError("model.safetensors has no tensor " + name);
    const ck::TensorView& v = *it->second;
    if (!taken_.insert(name).second) throw UserError("internal: " + name + " taken twice");
    torch::ScalarType t;
    switch (v.dtype) {
      case ck::DType::F32: t = torch::kFloat32; break;
      case ck::DType::BF16: t = torch::kBFloat16; break;
      case ck::DType::F16: t = torch::kFloat16; break;
      case ck::DType::F64: t = torch::kFloat64; break;
      default: throw UserError(strprintf("tensor %s has dtype %s; only floating-point weights are imported", name.c_str(),
                                         ck::dtype_name(v.dtype)));
    }
    auto shape = v.shape;
    return torch::from_blob(const_cast<std::byte*>(v.data), shape, torch::TensorOptions().dtype(t))
        .to(torch::kFloat32, /*non_blocking=*/false, /*copy=*/true);
  }
  torch::Tensor take_or_undefined(const std::string& name) { return has(name) ? take(name) : torch::Tensor(); }

  std::vector<std::string> untaken() const {
    std::vector<std::string> out;
    for (const auto& [name, view] : views_)
      if (!taken_.count(name)) out.push_back(name);
    return out;
  }

 private:
  std::vector<std::unique_ptr<ck::SafetensorsFile>> files_;
  std::map<std::string, const ck::TensorView*> views_;
  std::set<std::string> taken_;
};

// Hugging Face tensors under fp8tron's global parameter names (the inverse of hf_export.cpp's
// Converter): every parameter the model has must be produced here.
class Mapper {
 public:
  Mapper(HfTensors& hf, const ModelConfig& m) : hf_(hf), m_(m) {}

  std::map<std::string, torch::Tensor> gpt2() {
    // GPT2LMHeadModel's names carry "transformer."; a bare GPT2Model's do not.
    const std::string t = hf_.has("transformer.wte.weight") ? "transformer." : "";
    put("embedding.word_embeddings.weight", hf_.take(t + "wte.weight"));
    put("embedding.position_embeddings.weight", hf_.take(t + "wpe.weight"));
    const int64_t hidden_q = m_.num_attention_heads * m_.kv_channels, kv = m_.num_query_groups * m_.kv_channels;
    for (int64_t i = 0; i < m_.num_layers; ++i) {
      const std::string p = "decoder.layers." + std::to_string(i) + ".", h = t + "h." + std::to_string(i) + ".";
      norm(p + "self_attention.linear_qkv.layer_norm_weight", h + "ln_1.weight");
      put(p + "self_attention.linear_qkv.layer_norm_bias", hf_.take(h + "ln_1.bias"));
      // Conv1D keeps [in, out]; its outputs are all queries, then all keys, then all values.
      auto w = hf_.take(h + "attn.c_attn.weight").t();
      put(p + "self_attention.linear_qkv.weight",
          hf::fuse_qkv({w.narrow(0, 0, hidden_q), w.narrow(0, hidden_q, kv), w.narrow(0, hidden_q + kv, kv)}, shape()));
      auto b = hf_.take(h + "attn.c_attn.bias");
      put(p + "self_attention.linear_qkv.bias",
          hf::fuse_qkv({b.narrow(0, 0, hidden_q), b.narrow(0, hidden_q, kv), b.narrow(0, hidden_q + kv, kv)}, shape()));
      put(p + "self_attention.linear_proj.weight", hf_.take(h + "attn.c_proj.weight").t());
      put(p + "self_attention.linear_proj.bias", hf_.take(h + "attn.c_proj.bias"));
      norm(p + "mlp.linear_fc1.layer_norm_weight", h + "ln_2.weight");
      put(p + "mlp.linear_fc1.layer_norm_bias", hf_.take(h + "ln_2.bias"));
      put(p + "mlp.linear_fc1.weight", hf_.take(h + "mlp.c_fc.weight").t());
      put(p + "mlp.linear_fc1.bias", hf_.take(h + "mlp.c_fc.bias"));
      put(p + "mlp.linear_fc2.weight", hf_.take(h + "mlp.c_proj.weight").t());
      put(p + "mlp.linear_fc2.bias", hf_.take(h + "mlp.c_proj.bias"));
    }
    norm("decoder.final_layernorm.weight", t + "ln_f.weight");
    put("decoder.final_layernorm.bias", hf_.take(t + "ln_f.bias"));
    output_layer();
    return std::move(out_);
  }

  // Llama, Mixtral and Qwen2-MoE: which layers are MoE comes from the model's --moe-layer-freq.
  std::map<std::string, torch::Tensor> llama_family() {
    put("embedding.word_embeddings.weight", hf_.take("model.embed_tokens.weight"));
    for (int64_t i = 0; i < m_.num_layers; ++i) {
      const std::string p = "decoder.layers." + std::to_string(i) + ".", h = "model.layers." + std::to_string(i) + ".";
      norm(p + "self_attention.linear_qkv.layer_norm_weight", h + "input_layernorm.weight");
      put(p + "self_attention.linear_qkv.weight",
          qkv(hf_.take(h + "self_attn.q_proj.weight"), hf_.take(h + "self_attn.k_proj.weight"),
              hf_.take(h + "self_attn.v_proj.weight")));
      put(p + "self_attention.linear_proj.weight", hf_.take(h + "self_attn.o_proj.weight"));
      if (hf_.has(h + "self_attn.q_proj.bias")) {
        put(p + "self_attention.linear_qkv.bias",
            qkv(hf_.take(h + "self_attn.q_proj.bias"), hf_.take(h + "self_attn.k_proj.bias"),
                hf_.take(h + "self_attn.v_proj.bias")));
        put(p + "self_attention.linear_proj.bias", hf_.take_or_undefined(h + "self_attn.o_proj.bias"));
      }
      if (m_.moe.is_moe_layer(i)) {
        // A MoE layer's norm is its own module in Megatron (pre_mlp_layernorm), not fused into fc1.
        norm(p + "pre_mlp_layernorm.weight", h + "post_attention_layernorm.weight");
        experts(p + "mlp.", h);
        continue;
      }
      norm(p + "mlp.linear_fc1.layer_norm_weight", h + "post_attention_layernorm.weight");
      // SwiGLU's fc1 stacks [gate; up]: silu(gate) * up.
      put(p + "mlp.linear_fc1.weight", torch::cat({hf_.take(h + "mlp.gate_proj.weight"), hf_.take(h + "mlp.up_proj.weight")}));
      put(p + "mlp.linear_fc2.weight", hf_.take(h + "mlp.down_proj.weight"));
      if (hf_.has(h + "mlp.gate_proj.bias")) {
        put(p + "mlp.linear_fc1.bias", torch::cat({hf_.take(h + "mlp.gate_proj.bias"), hf_.take(h + "mlp.up_proj.bias")}));
        put(p + "mlp.linear_fc2.bias", hf_.take(h + "mlp.down_proj.bias"));
      }
    }
    norm("decoder.final_layernorm.weight", "model.norm.weight");
    output_layer();
    return std::move(out_);
  }

  // DeepSeek-V3: multi-latent attention (the inverse of the exporter's mapping), dense layers as
  // Llama's MLP, MoE layers with the router's e_score_correction_bias as Megatron's expert bias and
  // the ungated shared experts. With rope_interleave (the default) transformers de-interleaves the
  // rotary channels as Megatron's MLA does; without it, it rotates them as stored (rotate-half), so
  // the rotary rows are permuted to channel pairs here.
  std::map<std::string, torch::Tensor> deepseek_v3(bool rope_interleave) {
    const MlaConfig& a = m_.mla;
    const int64_t dn = a.qk_head_dim, dr = a.qk_pos_emb_head_dim, heads = m_.num_attention_heads;
    // Rows [heads, dn + dr, in] (query) or [kv_lora_rank + dr, in] (compressed kv): the rotary rows in Megatron's order.
    auto query_rows = [&](torch::Tensor w) {
      if (rope_interleave) return w;
      auto per_head = w.view({heads, dn + dr, w.size(1)});
      auto rope = hf::interleave_heads(per_head.narrow(1, dn, dr).reshape({heads * dr, w.size(1)}), dr);
      return torch::cat({per_head.narrow(1, 0, dn), rope.view({heads, dr, w.size(1)})}, 1).reshape(w.sizes());
    };
    auto kv_rows = [&](torch::Tensor w) {
      if (rope_interleave) return w;
      return torch::cat({w.narrow(0, 0, a.kv_lora_rank), hf::interleave_heads(w.narrow(0, a.kv_lora_rank, dr), dr)});
    };
    put("embedding.word_embeddings.weight", hf_.take("model.embed_tokens.weight"));
    for (int64_t i = 0; i < m_.num_layers; ++i) {
      const std::string p = "decoder.layers." + std::to_string(i) + ".", h = "model.layers." + std::to_string(i) + ".";
      const std::string att = p + "self_attention.", x = h + "self_attn.";
      norm(p + "input_layernorm.weight", h + "input_layernorm.weight");
      if (a.q_lora_rank) {
        put(att + "linear_q_down_proj.weight", hf_.take(x + "q_a_proj.weight"));
        norm(att + "linear_q_up_proj.layer_norm_weight", x + "q_a_layernorm.weight");
        put(att + "linear_q_up_proj.weight", query_rows(hf_.take(x + "q_b_proj.weight")));
      } else {
        put(att + "linear_q_proj.weight", query_rows(hf_.take(x + "q_proj.weight")));
      }
      put(att + "linear_kv_down_proj.weight", kv_rows(hf_.take(x + "kv_a_proj_with_mqa.weight")));
      norm(att + "linear_kv_up_proj.layer_norm_weight", x + "kv_a_layernorm.weight");
      put(att + "linear_kv_up_proj.weight", hf_.take(x + "kv_b_proj.weight"));
      put(att + "linear_proj.weight", hf_.take(x + "o_proj.weight"));
      if (m_.moe.is_moe_layer(i)) {
        norm(p + "pre_mlp_layernorm.weight", h + "post_attention_layernorm.weight");
        put(p + "mlp.router.expert_bias", hf_.take(h + "mlp.gate.e_score_correction_bias"));
        experts(p + "mlp.", h);
        continue;
      }
      norm(p + "mlp.linear_fc1.layer_norm_weight", h + "post_attention_layernorm.weight");
      put(p + "mlp.linear_fc1.weight", torch::cat({hf_.take(h + "mlp.gate_proj.weight"), hf_.take(h + "mlp.up_proj.weight")}));
      put(p + "mlp.linear_fc2.weight", hf_.take(h + "mlp.down_proj.weight"));
    }
    norm("decoder.final_layernorm.weight", "model.norm.weight");
    output_layer();
    return std::move(out_);
  }

  // The router and experts: Mixtral's block_sparse_moe.{gate, experts.E.w1 (gate), w3 (up), w2
  // (down)} as save_pretrained writes them, Qwen2-MoE's mlp.{gate, experts.E.{gate,up,down}_proj},
  // or transformers 5's fused mlp.experts.gate_up_proj [E, 2 * ffn, hidden] (gate rows first) and
  // down_proj [E, hidden, ffn]. Expert e's fc1 is [gate; up], as the dense SwiGLU's. Qwen2-MoE's
  // shared expert and its sigmoid gate map onto Megatron's shared_experts.
  void experts(const std::string& p, const std::string& h) {
    const int64_t n = m_.moe.num_experts;
    const bool mixtral = hf_.has(h + "block_sparse_moe.gate.weight");
    const std::string moe = h + (mixtral ? "block_sparse_moe." : "mlp.");
    put(p + "router.weight", hf_.take(moe + "gate.weight"));
    const bool split = hf_.has(moe + "experts.0." + (mixtral ? "w1" : "gate_proj") + ".weight");
    torch::Tensor gate_up, down;
    if (!split) {
      gate_up = hf_.take(moe + "experts.gate_up_proj");
      down = hf_.take(moe + "experts.down_proj");
    }
    for (int64_t e = 0; e < n; ++e) {
      const std::string x = moe + "experts." + std::to_string(e) + ".", i = std::to_string(e);
      if (!split) {
        put(p + "experts.linear_fc1.weight" + i, gate_up[e].clone());
        put(p + "experts.linear_fc2.weight" + i, down[e].clone());
      } else if (mixtral) {
        put(p + "experts.linear_fc1.weight" + i, torch::cat({hf_.take(x + "w1.weight"), hf_.take(x + "w3.weight")}));
        put(p + "experts.linear_fc2.weight" + i, hf_.take(x + "w2.weight"));
      } else {
        put(p + "experts.linear_fc1.weight" + i,
            torch::cat({hf_.take(x + "gate_proj.weight"), hf_.take(x + "up_proj.weight")}));
        put(p + "experts.linear_fc2.weight" + i, hf_.take(x + "down_proj.weight"));
      }
    }
    if (m_.moe.shared_expert_size > 0) {
      // Qwen2-MoE's shared_expert (gated), DeepSeek-V3's shared_experts.
      const std::string x = moe + (hf_.has(moe + "shared_experts.gate_proj.weight") ? "shared_experts." : "shared_expert.");
      put(p + "shared_experts.linear_fc1.weight",
          torch::cat({hf_.take(x + "gate_proj.weight"), hf_.take(x + "up_proj.weight")}));
      put(p + "shared_experts.linear_fc2.weight", hf_.take(x + "down_proj.weight"));
      if (m_.moe.shared_expert_gate) put(p + "shared_experts.gate_weight", hf_.take(moe + "shared_expert_gate.weight"));
    }
  }

 private:
  hf::QkvShape shape() const { return {m_.num_attention_heads, m_.num_query_groups, m_.kv_channels}; }

  void put(const std::string& name, torch::Tensor t) {
    if (t.defined()) out_[name] = std::move(t);
  }
  // --apply-layernorm-1p stores gamma - 1 (the exporter adds the 1 back).
  void norm(const std::string& name, const std::string& hf_name) {
    auto w = hf_.take(hf_name);
    put(name, m_.apply_layernorm_1p ? w - 1 : w);
  }
  // Hugging Face's q/k/v (rotate-half rows) as Megatron's fused rows; --rotary-interleaved
  // permutes q and k back to channel pairs, undoing what the exporter does.
  torch::Tensor qkv(torch::Tensor q, torch::Tensor k, torch::Tensor v) {
    if (m_.rotary.interleaved) {
      const bool bias = q.dim() == 1;
      auto permute = [&](const torch::Tensor& t) {
        return bias ? hf::interleave_heads(t.unsqueeze(1), m_.kv_channels).squeeze(1) : hf::interleave_heads(t, m_.kv_channels);
      };
      q = permute(q);
      k = permute(k);
    }
    return hf::fuse_qkv({q, k, v}, shape());
  }
  // The untied output layer; a checkpoint that has lm_head.weight but a tied model is refused
  // by the unused-tensor check (unless it equals the embedding, as some writers store it).
  void output_layer() {
    if (m_.untie_embeddings_and_output_weights) {
      put("output_layer.weight", hf_.take("lm_head.weight"));
    } else if (hf_.has("lm_head.weight")) {
      auto head = hf_.take("lm_head.weight");
      if (!torch::equal(head, out_.at("embedding.word_embeddings.weight")))
        throw UserError("config.json ties the embeddings (tie_word_embeddings) but lm_head.weight differs from the "
                        "input embedding");
    }
  }

  HfTensors& hf_;
  const ModelConfig& m_;
  std::map<std::string, torch::Tensor> out_;
};

ck::DType stored_dtype(ParamDtype d) {
  return d == ParamDtype::Bf16 ? ck::DType::BF16 : d == ParamDtype::Fp16 ? ck::DType::F16 : ck::DType::F32;
}
torch::ScalarType torch_of(ck::DType d) {
  return d == ck::DType::BF16 ? torch::kBFloat16 : d == ck::DType::F16 ? torch::kFloat16 : torch::kFloat32;
}

// The vocabulary rows padded to the model's (--make-vocab-size-divisible-by): the padding rows
// repeat the last row, as a load into a more padded layout does (checkpoint/load.cpp).
torch::Tensor pad_vocab(const torch::Tensor& t, int64_t rows) {
  if (t.size(0) == rows) return t;
  if (t.size(0) > rows) throw UserError(strprintf("the vocabulary has %lld rows, more than the model's %lld",
                                                  (long long)t.size(0), (long long)rows));
  return torch::cat({t, t.narrow(0, t.size(0) - 1, 1).expand({rows - t.size(0), t.size(1)})});
}

std::string unique_token() {
  return strprintf("import%lld_%lld", (long long)::getpid(),
                   (long long)std::chrono::steady_clock::now().time_since_epoch().count());
}

// fp8tron's fp32 logits for `tokens` random ids (seed 1234), from the checkpoint as written (read
// back from disk, fp32 main weights where stored), into `path` as "input_ids" and "logits": what
// transformers' logits of the imported model must match, the same file fp8tron-export writes.
void write_reference_logits(const ck::CheckpointLocation& location, const ModelConfig& model, int64_t tokens,
                            const std::string& path) {
  ModelConfig c = model;
  c.attention_dropout = c.hidden_dropout = 0;
  c.seq_length = std::max(c.seq_length, tokens);
  if (c.position_embedding == PositionEmbedding::LearnedAbsolute && tokens > c.max_position_embeddings)
    throw UserError(strprintf("--reference-tokens %lld exceeds the model's %lld positions", (long long)tokens,
                              (long long)c.max_position_embeddings));
  ck::CheckpointReader reader(location);
  torch::NoGradGuard no_grad;
  GptModel net(c);
  net->eval();
  for (auto& item : net->named_parameters()) {
    const std::string main = kMainParamPrefix + item.key();
    const std::string name = reader.has_tensor(main) ? main : item.key();
    const ck::TensorEntry& entry = reader.metadata().tensors.at(name);
    auto host = torch::empty(entry.shape, torch::TensorOptions().dtype(torch_of(entry.dtype)));
    reader.read(name, entry.dtype, entry.shape, ck::whole(entry.shape), host.data_ptr());
    item.value().copy_(host.to(torch::kFloat32));
  }
  for (auto& item : net->named_buffers()) {  // the routers' expert bias
    if (!reader.has_tensor(item.key())) continue;
    const ck::TensorEntry& entry = reader.metadata().tensors.at(item.key());
    auto host = torch::empty(entry.shape, torch::TensorOptions().dtype(torch_of(entry.dtype)));
    reader.read(item.key(), entry.dtype, entry.shape, ck::whole(entry.shape), host.data_ptr());
    item.value().copy_(host.to(torch::kFloat32));
  }
  auto generator = at::make_generator<at::CPUGeneratorImpl>(1234);
  auto ids = torch::randint(0, c.vocab_size, {1, tokens}, generator, torch::kInt64);
  auto logits = net->forward(ids).narrow(-1, 0, c.vocab_size).to(torch::kFloat32).contiguous();
  std::vector<ck::TensorToWrite> out = {{"input_ids", ck::DType::I64, ids.sizes().vec(), ids.data_ptr(), {}},
                                        {"logits", ck::DType::F32, logits.sizes().vec(), logits.data_ptr(), {}}};
  ck::write_safetensors(path, out, {{"format", "pt"}});
}

// Whether `name` is model.layers.N.* with N >= `layers` (past the decoder).
bool beyond_decoder(const std::string& name, int64_t layers) {
  const std::string prefix = "model.layers.";
  if (!name.starts_with(prefix)) return false;
  size_t used = 0;
  try {
    const int64_t n = std::stoll(name.substr(prefix.size()), &used);
    return n >= layers && name[prefix.size() + used] == '.';
  } catch (const std::exception&) {
    return false;
  }
}

// Flags parsed as the trainer parses them (argv[0] first).
FlagValues parse_flags(const std::vector<std::string>& flags) {
  std::vector<const char*> argv = {"fp8tron"};
  for (const auto& f : flags) argv.push_back(f.c_str());
  ParsedCommandLine parsed = parse_command_line(int(argv.size()), argv.data());
  return parsed.values;
}

}  // namespace

std::vector<std::string> hugging_face_model_flags(const std::string& hf_dir) { return model_flags(hf_dir).flags; }

ImportResult import_hugging_face(const ImportOptions& o) {
  if (o.hf_dir.empty()) throw UserError("--hf is required: the Hugging Face model directory to import");
  if (o.save.empty()) throw UserError("--save is required: the checkpoint directory to write");
  ModelFlags model = model_flags(o.hf_dir);

  // The caller's flags may add to the model's (e.g. --bf16, --rotary-interleaved) but not contradict it.
  const FlagValues extra = parse_flags(o.flags);
  const FlagValues mine = parse_flags(model.flags);
  // Values compare as numbers where both are (1e-5 and 1e-05 agree).
  const auto same = [](const std::vector<std::string>& a, const std::vector<std::string>& b) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i) {
      if (a[i] == b[i]) continue;
      try {
        size_t used_a = 0, used_b = 0;
        if (std::stod(a[i], &used_a) == std::stod(b[i], &used_b) && used_a == a[i].size() && used_b == b[i].size())
          continue;
      } catch (const std::exception&) {
      }
      return false;
    }
    return true;
  };
  for (const auto& [name, values] : extra.all_given()) {
    if (!mine.given(name)) continue;
    if (!same(values, mine.all_given().at(name)))
      throw UserError("--" + name + " " + join(values, " ") + " contradicts config.json, which gives --" + name + " " +
                      join(mine.all_given().at(name), " "));
  }
  for (const char* owned : {"save", "load"})
    if (extra.given(owned))
      throw UserError(std::string("--") + owned + " is not one of the model's flags (fp8tron-import's --save names the "
                      "checkpoint directory)");
  std::vector<std::string> all = model.flags;
  all.insert(all.end(), o.flags.begin(), o.flags.end());
  // Training-only flags a configuration needs; any the caller gave win.
  const bool data = extra.given("data-path") || extra.given("mock-data") || extra.given("builtin-data") ||
                    extra.given("train-data-path");
  if (!data) all.push_back("--mock-data");
  if (!extra.given("seq-length")) {
    const int64_t positions = mine.get_int("max-position-embeddings");
    all.insert(all.end(), {"--seq-length", std::to_string(std::min<int64_t>(positions, 4096))});
  }
  if (!extra.given("device")) all.insert(all.end(), {"--device", "cpu"});
  if (!extra.given("micro-batch-size")) all.insert(all.end(), {"--micro-batch-size", "1"});
  if (!extra.given("train-iters") && !extra.given("train-samples")) all.insert(all.end(), {"--train-iters", "1"});
  if (!extra.given("lr")) all.insert(all.end(), {"--lr", "1e-4"});
  const int64_t vocab = mine.get_int("vocab-size");
  // A --tokenizer-type given here is not read: the vocabulary is config.json's.
  const Config config = build_config(parse_flags(all), LaunchEnv{}, false,
                                     [&](const DataConfig&) { return TokenizerInfo{vocab, vocab - 1, -1}; });
  const ModelConfig& m = config.model;
  if (m.vocab_size != vocab)
    throw UserError(strprintf("the flags give a vocabulary of %lld ids but config.json's vocab_size is %lld",
                              (long long)m.vocab_size, (long long)vocab));

  // The model fp8tron builds from these flags says which tensors the checkpoint must hold.
  torch::NoGradGuard no_grad;
  GptModel net(m);
  HfTensors hf(o.hf_dir);
  Mapper mapper(hf, m);
  const json hf_config = read_json(o.hf_dir + "/config.json");
  std::map<std::string, torch::Tensor> tensors =
      model.format == "gpt2"          ? mapper.gpt2()
      : model.format == "deepseek_v3" ? mapper.deepseek_v3(hf_config.value("rope_interleave", true))
                                      : mapper.llama_family();
  int64_t mtp_tensors = 0;
  for (const auto& name : hf.untaken()) {
    // Buffers some writers store (GPT-2's causal mask, rotary frequencies) are recomputed by fp8tron.
    if (name.ends_with(".attn.bias") || name.ends_with(".attn.masked_bias") || name.ends_with("rotary_emb.inv_freq"))
      continue;
    // DeepSeek-V3's checkpoints hold their multi-token-prediction layers after the decoder's
    // (model.layers.<num_hidden_layers>...); transformers does not run them either.
    if (model.format == "deepseek_v3" && beyond_decoder(name, m.num_layers)) {
      if (++mtp_tensors == 1) model.notes.push_back("the multi-token-prediction layers (model.layers." +
                                                   std::to_string(m.num_layers) + " on) are not imported");
      continue;
    }
    throw UserError("model.safetensors holds " + name + ", which this fp8tron model has no place for (a flag that "
                    "drops it, or a " + model.format + " variant fp8tron does not build)");
  }

  const ck::DType dtype = stored_dtype(config.precision.params_dtype);
  // Host copies in the stored dtype; they live until the file is written.
  std::vector<std::pair<std::string, torch::Tensor>> stored;
  for (const auto& item : net->named_parameters()) {
    const std::string& name = item.key();
    auto it = tensors.find(name);
    if (it == tensors.end())
      throw UserError("the Hugging Face model has no weights for fp8tron's " + name + " (a flag that adds it?)");
    torch::Tensor t = it->second;
    const bool vocab_rows = name == "embedding.word_embeddings.weight" || name == "output_layer.weight";
    if (vocab_rows) t = pad_vocab(t, item.value().size(0));
    if (t.sizes() != item.value().sizes())
      throw UserError("shape mismatch for " + name + ": " + ck::shape_string(t.sizes().vec()) + " from Hugging Face, " +
                      ck::shape_string(item.value().sizes().vec()) + " in fp8tron's model (are the flags config.json's?)");
    if (!torch::isfinite(t).all().item<bool>()) throw UserError("the Hugging Face weights of " + name + " hold NaN or inf");
    stored.emplace_back(name, t.to(torch_of(dtype)).contiguous());
    // bf16/fp16 runs also get fp32 main weights, so --load-main-params-from-ckpt keeps full precision.
    if (dtype != ck::DType::F32) stored.emplace_back(kMainParamPrefix + name, t.contiguous());
    tensors.erase(it);
  }
  for (const auto& item : net->named_buffers()) {
    // MoE routers' expert bias: DeepSeek-V3's e_score_correction_bias, else its initial value.
    auto it = tensors.find(item.key());
    torch::Tensor t = it == tensors.end() ? item.value() : it->second;
    if (t.sizes() != item.value().sizes())
      throw UserError("shape mismatch for " + item.key() + ": " + ck::shape_string(t.sizes().vec()) + " from Hugging Face, " +
                      ck::shape_string(item.value().sizes().vec()) + " in fp8tron's model");
    stored.emplace_back(item.key(), t.to(torch::kFloat32).contiguous());
    if (it != tensors.end()) tensors.erase(it);
  }
  if (!tensors.empty())
    throw UserError("fp8tron's model has no parameter " + tensors.begin()->first + " (the flags drop what config.json has)");

  // Megatron's layout at iteration 0, written and committed as a save is.
  const std::vector<int64_t> existing = ck::list_checkpoint_iterations(o.save);
  if (!existing.empty())
    throw UserError(strprintf("--save %s already holds a checkpoint (iteration %lld); import into a new directory",
                              o.save.c_str(), (long long)existing.front()));
  ck::SaveTarget target{o.save, 0, false, unique_token()};
  ImportResult result;
  try {
    const std::string tmp = ck::begin_save(target);
    ck::RankShardWriter writer(ck::rank_file_name(0));
    for (const auto& [name, t] : stored) {
      const ck::DType d = t.scalar_type() == torch::kFloat32 ? ck::DType::F32 : dtype;
      writer.add(name, d, t.sizes().vec(), ck::whole(t.sizes().vec()), t.data_ptr());
    }
    const ck::WriteStats stats = writer.write(tmp);
    ck::CheckpointMetadata meta;
    meta.iteration = 0;
    for (const auto& [name, value] : config.resolved_flags) meta.args[name] = value;
    for (const auto& f : model_fields(m)) meta.args["model." + f.key] = f.value;
    meta.args["imported-from"] = std::filesystem::absolute(o.hf_dir).string();
    meta.fp8tron_version = fp8tron_version();
    meta.fp8tron_commit = fp8tron_commit();
    meta.tensors = writer.table();
    std::map<std::string, uint64_t> checksums;
    const auto keys = writer.keys();
    for (size_t i = 0; i < keys.size(); ++i) checksums[keys[i]] = stats.checksums.at(i);
    for (auto& [name, entry] : meta.tensors)
      for (auto& shard : entry.shards) shard.checksum = checksums.at(shard.key);
    ck::write_metadata(tmp, meta);
    ck::CommitOptions commit;
    commit.expected_files = {ck::rank_file_name(0), ck::kMetadataFileName};
    commit.expected_file_count = 2;
    ck::commit_save(target, commit);
    result.bytes = stats.bytes;
  } catch (...) {
    ck::abort_save(target);
    throw;
  }
  result.format = model.format;
  result.flags = model.flags;
  result.notes = model.notes;
  result.tensors = int64_t(stored.size());
  result.flags_file = o.save + "/model_flags.txt";
  ck::write_file_atomically(result.flags_file, join(model.flags, " ") + "\n");
  if (o.reference_tokens > 0) {
    result.reference_file = o.save + "/fp8tron_reference.safetensors";
    write_reference_logits(ck::locate_checkpoint(o.save, 0), m, o.reference_tokens, result.reference_file);
  }
  return result;
}

}  // namespace fp8tron
