#include "trainer/export/hf_export.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/text.h"
#include "models/gpt_model.h"
#include "checkpoint/checkpoint_dir.h"
#include "checkpoint/file_io.h"
#include "checkpoint/metadata.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/sharded_io.h"
#include "trainer/export/hf_layout.h"

namespace fp8tron {
namespace {
namespace ck = checkpoint;

torch::ScalarType torch_dtype(ck::DType d) {
  switch (d) {
    case ck::DType::F32: return torch::kFloat32;
    case ck::DType::BF16: return torch::kBFloat16;
    case ck::DType::F16: return torch::kFloat16;
    case ck::DType::F64: return torch::kFloat64;
    default: throw UserError(std::string("cannot export a tensor of dtype ") + ck::dtype_name(d));
  }
}

ck::DType checkpoint_dtype(torch::ScalarType t) {
  return t == torch::kBFloat16 ? ck::DType::BF16 : t == torch::kFloat16 ? ck::DType::F16 : ck::DType::F32;
}

const char* hf_dtype_name(torch::ScalarType t) {
  return t == torch::kBFloat16 ? "bfloat16" : t == torch::kFloat16 ? "float16" : "float32";
}

// The model as the checkpoint describes it (its arguments), and its tensors.
class Source {
 public:
  explicit Source(const ck::CheckpointLocation& location) : reader_(location) {}

  const ck::CheckpointMetadata& metadata() const { return reader_.metadata(); }

  std::string arg(const std::string& key) const {
    auto it = metadata().args.find(key);
    if (it == metadata().args.end() || it->second == "None")
      throw UserError("checkpoint " + reader_.location().path + " does not record '" + key +
                      "'; it cannot be exported (was it written by an older fp8tron?)");
    return it->second;
  }
  int64_t integer(const std::string& key) const { return std::stoll(arg(key)); }
  // A value older checkpoints may lack (then `fallback`).
  std::string arg_or(const std::string& key, const std::string& fallback) const {
    auto it = metadata().args.find(key);
    return it == metadata().args.end() || it->second == "None" ? fallback : it->second;
  }
  double number(const std::string& key) const { return std::stod(arg(key)); }
  bool flag(const std::string& key) const { return arg(key) == "true"; }
  bool has(const std::string& name) const { return reader_.has_tensor(name); }

  // A whole global tensor: the fp32 main weights when they exist and fp32 is asked for, else the
  // model weights; converted to `dtype`.
  torch::Tensor tensor(const std::string& name, torch::ScalarType dtype) {
    std::string source = name;
    const std::string main = "optimizer.state.fp32_param." + name;
    if (dtype == torch::kFloat32 && has(main)) source = main;
    if (!has(source)) {
      // read() names the missing tensor with a suggestion.
      float dummy = 0;
      reader_.read(source, ck::DType::F32, {1}, ck::whole({1}), &dummy);
    }
    const ck::TensorEntry& entry = metadata().tensors.at(source);
    auto out = torch::empty(entry.shape, torch::TensorOptions().dtype(torch_dtype(entry.dtype)));
    reader_.read(source, entry.dtype, entry.shape, ck::whole(entry.shape), out.data_ptr());
    return out.to(dtype);
  }

 private:
  ck::CheckpointReader reader_;
};

struct Model {
  int64_t layers, hidden, ffn, heads, groups, head_dim, vocab, padded_vocab;
  bool learned_positions, rms_norm, swiglu, bias_linear, qkv_bias, untied, qk_layernorm, layernorm_1p;
  double eps, rotary_percent, rotary_base, std;
  int64_t max_positions, seq_length;
  double attention_dropout, hidden_dropout;
  std::string tokenizer_type;
  std::string positions;  // learned_absolute | rope | yarn | none
  bool squared_relu = false;
  RotaryConfig rotary;    // interleaving, Llama 3.1 scaling, YaRN
  MlaConfig mla;
  MoeConfig moe;          // num_experts 0: a dense model
  int64_t mtp_layers = 0;
};

std::optional<double> optional_number(const Source& s, const std::string& key) {
  const std::string v = s.arg_or(key, "None");
  if (v == "None") return std::nullopt;
  return std::stod(v);
}

// The mixture-of-experts settings the checkpoint records (model.* fields and the resolved --moe-*
// flags), as the trainer's MoeConfig: what a Hugging Face router must reproduce.
MoeConfig read_moe(const Source& s, int64_t layers) {
  MoeConfig e;
  e.num_experts = std::stoll(s.arg_or("model.num_experts", "0"));
  if (!e.enabled()) return e;
  e.ffn_hidden_size = s.integer("model.moe_ffn_hidden_size");
  const std::string pattern = s.arg("model.moe_layer_freq");  // one 0/1 per layer
  if (int64_t(pattern.size()) != layers)
    throw UserError("the checkpoint's model.moe_layer_freq '" + pattern + "' does not give one 0/1 per layer");
  for (char c : pattern) e.layer_pattern.push_back(c == '1');
  e.topk = s.integer("moe-router-topk");
  const std::string score = s.arg_or("moe-router-score-function", "softmax");
  e.score_function = score == "sigmoid"       ? MoeScoreFunction::kSigmoid
                     : score == "sqrtsoftplus" ? MoeScoreFunction::kSqrtSoftplus
                                               : MoeScoreFunction::kSoftmax;
  e.pre_softmax = s.arg_or("moe-router-pre-softmax", "false") == "true";
  e.topk_scaling_factor = optional_number(s, "moe-router-topk-scaling-factor");
  e.enable_expert_bias = s.arg_or("model.moe_router_enable_expert_bias", "false") == "true";
  if (auto g = optional_number(s, "moe-router-num-groups")) e.num_groups = int64_t(*g);
  if (auto g = optional_number(s, "moe-router-group-topk")) e.group_topk = int64_t(*g);
  e.shared_expert_size = std::stoll(s.arg_or("model.moe_shared_expert_intermediate_size", "0"));
  e.shared_expert_gate = s.arg_or("model.moe_shared_expert_gate", "false") == "true";
  e.capacity_factor = optional_number(s, "moe-expert-capacity-factor");
  if (e.capacity_factor && *e.capacity_factor < 0) e.capacity_factor.reset();  // Megatron: negative = dropless
  e.input_jitter_eps = optional_number(s, "moe-input-jitter-eps");
  e.force_load_balancing = s.arg_or("moe-router-force-load-balancing", "false") == "true";
  if (s.arg_or("moe-router-load-balancing-type", "aux_loss").find("sinkhorn") != std::string::npos)
    e.balancing = {MoeBalancingTerm{MoeBalancing::kSinkhorn, 0.0}};
  return e;
}

Model read_model(const Source& s) {
  // Gated attention (Qwen3-Next's) comes with its linear-attention layers in transformers: no class
  // holds a plain decoder with the gate.
  if (s.arg_or("model.attention_output_gate", "false") == "true")
    throw UserError("the checkpoint's attention has an output gate (--attention-output-gate); Hugging Face export of "
                    "gated attention is not implemented");
  // MuP multiplies the embeddings and logits and rescales attention: no Hugging Face config holds that.
  if (s.arg_or("model.use_mup", "false") == "true")
    throw UserError("the checkpoint was trained with --use-mup, whose embedding, logit and attention multipliers no "
                    "Hugging Face GPT-2 / Llama / DeepSeek-V3 config holds; Hugging Face export of MuP models is not implemented");
  Model m;
  m.layers = s.integer("model.num_layers");
  m.hidden = s.integer("model.hidden_size");
  m.ffn = s.integer("model.ffn_hidden_size");
  m.heads = s.integer("model.num_attention_heads");
  m.groups = s.integer("model.num_query_groups");
  m.head_dim = s.integer("model.kv_channels");
  m.vocab = s.integer("model.vocab_size");
  m.padded_vocab = s.integer("model.padded_vocab_size");
  m.learned_positions = s.arg("model.position_embedding_type") == "learned_absolute";
  m.rms_norm = s.arg("model.normalization") == "RMSNorm";
  m.swiglu = s.flag("model.swiglu");
  m.bias_linear = s.flag("model.add_bias_linear");
  m.qkv_bias = s.flag("model.add_qkv_bias");
  m.untied = s.flag("model.untie_embeddings_and_output_weights");
  m.qk_layernorm = s.flag("model.qk_layernorm");
  m.layernorm_1p = s.flag("model.apply_layernorm_1p");
  m.eps = s.number("norm-epsilon");
  m.rotary_percent = s.number("rotary-percent");
  m.rotary_base = s.number("rotary-base");
  m.std = s.number("init-method-std");
  m.seq_length = s.integer("seq-length");
  m.max_positions = m.learned_positions ? s.integer("model.max_position_embeddings") : m.seq_length;
  m.attention_dropout = s.number("attention-dropout");
  m.hidden_dropout = s.number("hidden-dropout");
  auto tok = s.metadata().args.find("tokenizer-type");
  m.tokenizer_type = tok == s.metadata().args.end() ? "" : tok->second;
  // Model variants (absent from checkpoints written before them).
  m.positions = s.arg("model.position_embedding_type");
  m.squared_relu = s.arg_or("model.squared_relu", "false") == "true";
  m.rotary.interleaved = s.arg_or("rotary-interleaved", "false") == "true";
  m.rotary.llama3_scaling = s.arg_or("use-rope-scaling", "false") == "true";
  m.rotary.llama3_factor = std::stod(s.arg_or("rope-scaling-factor", "8.0"));
  YarnConfig& y = m.rotary.yarn;
  y.scaling_factor = std::stod(s.arg_or("rotary-scaling-factor", "1.0"));
  y.mscale = std::stod(s.arg_or("mscale", "1.0"));
  y.mscale_all_dim = std::stod(s.arg_or("mscale-all-dim", "0.0"));
  if (m.positions == "yarn") {
    y.original_max_position_embeddings = std::stoll(s.arg_or("yarn-original-max-position-embeddings", "4096"));
    y.beta_fast = std::stod(s.arg_or("yarn-beta-fast", "32"));
    y.beta_slow = std::stod(s.arg_or("yarn-beta-slow", "1"));
    y.correction_range_round_to_int = s.arg_or("no-yarn-correction-range-round-to-int", "false") != "true";
  }
  m.mla.enabled = s.arg_or("model.multi_latent_attention", "false") == "true";
  if (m.mla.enabled) {
    const std::string q = s.arg("model.q_lora_rank");
    if (q != "none") m.mla.q_lora_rank = std::stoll(q);
    m.mla.kv_lora_rank = s.integer("model.kv_lora_rank");
    m.mla.qk_head_dim = s.integer("model.qk_head_dim");
    m.mla.qk_pos_emb_head_dim = s.integer("model.qk_pos_emb_head_dim");
    m.mla.v_head_dim = s.integer("model.v_head_dim");
    m.mla.yarn = s.arg_or("rope-type", "yarn") == "yarn";
  }
  m.mtp_layers = std::stoll(s.arg_or("model.mtp_num_layers", "0"));
  m.moe = read_moe(s, m.layers);
  return m;
}

std::string detect_format(const Model& m) {
  if (m.mla.enabled) return "deepseek_v3";
  if (m.learned_positions && !m.rms_norm && !m.swiglu) return "gpt2";
  if ((m.positions == "rope" || m.positions == "yarn") && m.rms_norm && m.swiglu) {
    // A shared expert (with its gate) is Qwen2-MoE's; routed experts alone are Mixtral's.
    if (m.moe.enabled()) return m.moe.shared_expert_size > 0 ? "qwen2_moe" : "mixtral";
    // Biases on q, k and v only are Qwen2's (Llama's attention biases include o_proj).
    return m.qkv_bias && !m.bias_linear ? "qwen2" : "llama";
  }
  throw UserError(strprintf("this model (%s positions, %s, %s) is neither GPT-2-style (learned positions, LayerNorm, "
                            "GeLU or squared ReLU), LLaMA-style (RoPE or YaRN, RMSNorm, SwiGLU) nor DeepSeek-V3-style "
                            "(multi-latent attention); Hugging Face has no class for it",
                            m.positions.c_str(), m.rms_norm ? "RMSNorm" : "LayerNorm",
                            m.swiglu ? "SwiGLU" : m.squared_relu ? "squared ReLU" : "GeLU"));
}

// Hugging Face's rope_scaling for the model's rotary variant (null without one).
nlohmann::ordered_json rope_scaling(const RotaryConfig& r, bool yarn, int64_t* max_positions) {
  if (yarn && r.yarn.scaling_factor > 1) {
    const YarnConfig& y = r.yarn;
    // transformers takes the factor as max_position_embeddings / original_max_position_embeddings,
    // and its cos/sin factor from mscale / mscale_all_dim only when both are set: write the
    // factor Megatron applies explicitly.
    *max_positions = int64_t(y.scaling_factor * double(y.original_max_position_embeddings));
    RotarySpec spec;
    spec.scaling = RotaryScaling::Yarn;
    spec.yarn = y;
    return {{"rope_type", "yarn"}, {"factor", y.scaling_factor},
            {"original_max_position_embeddings", y.original_max_position_embeddings},
            {"beta_fast", y.beta_fast}, {"beta_slow", y.beta_slow}, {"mscale", y.mscale},
            {"mscale_all_dim", y.mscale_all_dim}, {"attention_factor", rotary_concentration(spec)},
            {"truncate", y.correction_range_round_to_int}};
  }
  if (r.llama3_scaling)
    return {{"rope_type", "llama3"}, {"factor", r.llama3_factor}, {"low_freq_factor", 1.0}, {"high_freq_factor", 4.0},
            {"original_max_position_embeddings", 8192}};
  return nullptr;
}

// The eps transformers' DeepseekV3RMSNorm defaults to (its attention latents' norms keep it).
constexpr double kHfLatentNormEps = 1e-6;

void require(bool ok, const std::string& format, const std::string& what) {
  if (!ok) throw UserError("cannot export to " + format + ": " + what);
}

// The tensors to write, in order, and the config.json.
struct HfModel {
  std::vector<std::pair<std::string, torch::Tensor>> tensors;
  nlohmann::ordered_json config;
  std::vector<std::string> notes;  // ExportResult::notes
  void add(const std::string& name, torch::Tensor t) { tensors.emplace_back(name, t.contiguous()); }
};

using hf::deinterleave_heads;
using hf::Qkv;
Qkv split_qkv(const torch::Tensor& qkv, const Model& m) { return hf::split_qkv(qkv, {m.heads, m.groups, m.head_dim}); }

class Converter {
 public:
  Converter(Source& s, const Model& m, torch::ScalarType dtype) : s_(s), m_(m), dtype_(dtype) {}

  torch::Tensor get(const std::string& name) { return s_.tensor(name, dtype_); }
  // A norm's weight as Hugging Face applies it (zero-centred gamma gets its 1 back, in fp32).
  torch::Tensor norm_weight(const std::string& name) {
    auto w = s_.tensor(name, torch::kFloat32);
    return (m_.layernorm_1p ? w + 1 : w).to(dtype_);
  }
  torch::Tensor bias_or_zeros(const std::string& name, int64_t n) {
    return s_.has(name) ? get(name) : torch::zeros({n}, torch::TensorOptions().dtype(dtype_));
  }
  torch::Tensor vocab_rows(const std::string& name) { return get(name).narrow(0, 0, m_.vocab); }

  HfModel gpt2() {
    const std::string f = "gpt2";
    require(m_.groups == m_.heads, f, "grouped-query attention (--num-query-groups) has no GPT-2 equivalent");
    require(m_.head_dim * m_.heads == m_.hidden, f, "GPT-2 needs --kv-channels x --num-attention-heads = --hidden-size");
    require(!m_.qk_layernorm, f, "--qk-layernorm has no GPT-2 equivalent");
    require(!m_.rotary.interleaved, f, "GPT-2 has no rotary embeddings");
    HfModel hf;
    hf.add("transformer.wte.weight", vocab_rows("embedding.word_embeddings.weight"));
    hf.add("transformer.wpe.weight", get("embedding.position_embeddings.weight"));
    for (int64_t i = 0; i < m_.layers; ++i) {
      const std::string p = "decoder.layers." + std::to_string(i) + ".", h = "transformer.h." + std::to_string(i) + ".";
      hf.add(h + "ln_1.weight", norm_weight(p + "self_attention.linear_qkv.layer_norm_weight"));
      hf.add(h + "ln_1.bias", get(p + "self_attention.linear_qkv.layer_norm_bias"));
      // Conv1D stores [in, out]; the output is all queries, then keys, then values.
      Qkv w = split_qkv(get(p + "self_attention.linear_qkv.weight"), m_);
      hf.add(h + "attn.c_attn.weight", torch::cat({w.q, w.k, w.v}, 0).t());
      Qkv b = split_qkv(bias_or_zeros(p + "self_attention.linear_qkv.bias", (m_.heads + 2 * m_.groups) * m_.head_dim), m_);
      hf.add(h + "attn.c_attn.bias", torch::cat({b.q, b.k, b.v}, 0));
      hf.add(h + "attn.c_proj.weight", get(p + "self_attention.linear_proj.weight").t());
      hf.add(h + "attn.c_proj.bias", bias_or_zeros(p + "self_attention.linear_proj.bias", m_.hidden));
      hf.add(h + "ln_2.weight", norm_weight(p + "mlp.linear_fc1.layer_norm_weight"));
      hf.add(h + "ln_2.bias", get(p + "mlp.linear_fc1.layer_norm_bias"));
      hf.add(h + "mlp.c_fc.weight", get(p + "mlp.linear_fc1.weight").t());
      hf.add(h + "mlp.c_fc.bias", bias_or_zeros(p + "mlp.linear_fc1.bias", m_.ffn));
      hf.add(h + "mlp.c_proj.weight", get(p + "mlp.linear_fc2.weight").t());
      hf.add(h + "mlp.c_proj.bias", bias_or_zeros(p + "mlp.linear_fc2.bias", m_.hidden));
    }
    hf.add("transformer.ln_f.weight", norm_weight("decoder.final_layernorm.weight"));
    hf.add("transformer.ln_f.bias", get("decoder.final_layernorm.bias"));
    if (m_.untied) hf.add("lm_head.weight", vocab_rows("output_layer.weight"));
    hf.config = {{"architectures", {"GPT2LMHeadModel"}},
                 {"model_type", "gpt2"},
                 {"vocab_size", m_.vocab},
                 {"n_positions", m_.max_positions},
                 {"n_ctx", m_.max_positions},
                 {"n_embd", m_.hidden},
                 {"n_layer", m_.layers},
                 {"n_head", m_.heads},
                 {"n_inner", m_.ffn},
                 // GeLU's tanh approximation, as fp8tron's, or squared ReLU (transformers' ACT2FN["relu2"])
                 {"activation_function", m_.squared_relu ? "relu2" : "gelu_new"},
                 {"layer_norm_epsilon", m_.eps},
                 {"resid_pdrop", m_.hidden_dropout},
                 {"embd_pdrop", m_.hidden_dropout},
                 {"attn_pdrop", m_.attention_dropout},
                 {"initializer_range", m_.std},
                 {"scale_attn_weights", true},
                 {"tie_word_embeddings", !m_.untied},
                 {"torch_dtype", hf_dtype_name(dtype_)}};
    if (m_.tokenizer_type == "GPT2BPETokenizer") {
      hf.config["bos_token_id"] = 50256;
      hf.config["eos_token_id"] = 50256;
    }
    return hf;
  }

  // Llama-family attention: the input norm, q/k/v split in Hugging Face's head order (rows
  // permuted to rotate-half for --rotary-interleaved), o_proj; q/k/v biases with `qkv_bias`
  // (zeros where the model has none) and o_proj's with `o_bias`.
  void llama_attention(HfModel& hf, const std::string& p, const std::string& h, bool qkv_bias, bool o_bias) {
    hf.add(h + "input_layernorm.weight", norm_weight(p + "self_attention.linear_qkv.layer_norm_weight"));
    // Query head j of group g is head g * (heads / groups) + j: Hugging Face's repeat_kv order.
    Qkv w = split_qkv(get(p + "self_attention.linear_qkv.weight"), m_);
    if (m_.rotary.interleaved) {
      w.q = deinterleave_heads(w.q, m_.head_dim);
      w.k = deinterleave_heads(w.k, m_.head_dim);
    }
    hf.add(h + "self_attn.q_proj.weight", w.q);
    hf.add(h + "self_attn.k_proj.weight", w.k);
    hf.add(h + "self_attn.v_proj.weight", w.v);
    hf.add(h + "self_attn.o_proj.weight", get(p + "self_attention.linear_proj.weight"));
    if (qkv_bias) {
      Qkv b = split_qkv(bias_or_zeros(p + "self_attention.linear_qkv.bias", (m_.heads + 2 * m_.groups) * m_.head_dim), m_);
      if (m_.rotary.interleaved) {
        b.q = deinterleave_heads(b.q.unsqueeze(1), m_.head_dim).squeeze(1);
        b.k = deinterleave_heads(b.k.unsqueeze(1), m_.head_dim).squeeze(1);
      }
      hf.add(h + "self_attn.q_proj.bias", b.q);
      hf.add(h + "self_attn.k_proj.bias", b.k);
      hf.add(h + "self_attn.v_proj.bias", b.v);
    }
    if (o_bias) hf.add(h + "self_attn.o_proj.bias", bias_or_zeros(p + "self_attention.linear_proj.bias", m_.hidden));
  }

  // A dense SwiGLU MLP (`mlp` its fp8tron prefix, `out` Hugging Face's): fc1 stacks [gate; up],
  // silu(gate) * up; fc2 is down_proj. The norm fused into fc1 is post_attention_layernorm.
  void swiglu_mlp(HfModel& hf, const std::string& mlp, const std::string& out, int64_t ffn, bool bias) {
    auto fc1 = get(mlp + "linear_fc1.weight");
    hf.add(out + "gate_proj.weight", fc1.narrow(0, 0, ffn));
    hf.add(out + "up_proj.weight", fc1.narrow(0, ffn, ffn));
    hf.add(out + "down_proj.weight", get(mlp + "linear_fc2.weight"));
    if (bias) {
      auto b1 = get(mlp + "linear_fc1.bias");
      hf.add(out + "gate_proj.bias", b1.narrow(0, 0, ffn));
      hf.add(out + "up_proj.bias", b1.narrow(0, ffn, ffn));
      hf.add(out + "down_proj.bias", get(mlp + "linear_fc2.bias"));
    }
  }

  // The routed experts, one Hugging Face module per expert (the importer's inverse): expert e's
  // grouped linear_fc1 rows [gate; up] become `gate` and `up`, its linear_fc2 `down`, under
  // `out` + "e.". transformers 5 fuses them into gate_up_proj/down_proj as it loads.
  void routed_experts(HfModel& hf, const std::string& mlp, const std::string& out, const char* gate, const char* up,
                      const char* down) {
    const int64_t ffn = m_.moe.ffn_hidden_size;
    for (int64_t e = 0; e < m_.moe.num_experts; ++e) {
      const std::string i = std::to_string(e), x = out + i + ".";
      auto fc1 = get(mlp + "experts.linear_fc1.weight" + i);
      hf.add(x + gate + ".weight", fc1.narrow(0, 0, ffn));
      hf.add(x + up + ".weight", fc1.narrow(0, ffn, ffn));
      hf.add(x + down + ".weight", get(mlp + "experts.linear_fc2.weight" + i));
    }
  }

  // What no Hugging Face MoE class computes, whichever the family.
  void require_moe_inference(const std::string& f) {
    const MoeConfig& e = m_.moe;
    require(!e.capacity_factor, f, "--moe-expert-capacity-factor drops tokens over each expert's capacity; transformers' "
                                   "experts take every routed token (train dropless to export)");
    require(!e.has_balancing(MoeBalancing::kSinkhorn), f,
            "--moe-router-load-balancing-type sinkhorn routes differently from any Hugging Face router");
    require(!e.force_load_balancing, f, "--moe-router-force-load-balancing routes on random logits");
    require(!e.input_jitter_eps, f, "--moe-input-jitter-eps scales the router's input by noise; transformers' routers have none");
    require(e.score_function != MoeScoreFunction::kSqrtSoftplus, f,
            "--moe-router-score-function sqrtsoftplus has no Hugging Face router");
    require(!m_.bias_linear, f, "the experts and o_proj have no biases in Hugging Face's MoE classes (--disable-bias-linear)");
  }
  // Mixtral's and Qwen2-MoE's routers: a softmax over the experts, no bias, groups or scaling.
  void require_softmax_router(const std::string& f) {
    const MoeConfig& e = m_.moe;
    require(e.score_function == MoeScoreFunction::kSoftmax, f,
            "its router takes a softmax (--moe-router-score-function sigmoid is DeepSeek-V3's, with multi-latent attention)");
    require(!e.enable_expert_bias, f, "--moe-router-enable-expert-bias (aux-loss-free expert bias) has no place in its router");
    require(!e.group_topk, f, "group-limited routing (--moe-router-group-topk) is DeepSeek-V3's");
    require(!e.topk_scaling_factor || *e.topk_scaling_factor == 0.0 || *e.topk_scaling_factor == 1.0, f,
            "--moe-router-topk-scaling-factor has no place in its router");
  }
  void require_llama_attention(const std::string& f) {
    require(m_.rotary_percent == 1.0 || m_.positions == "yarn", f, "its attention rotates every dimension (--rotary-percent 1)");
    require(!m_.qk_layernorm, f, "--qk-layernorm has no equivalent in its attention");
  }

  // The Llama family's embedding, final norm and head around `layer(i, p, h)`.
  template <class Layer>
  void llama_family_body(HfModel& hf, Layer layer) {
    hf.add("model.embed_tokens.weight", vocab_rows("embedding.word_embeddings.weight"));
    for (int64_t i = 0; i < m_.layers; ++i)
      layer(i, "decoder.layers." + std::to_string(i) + ".", "model.layers." + std::to_string(i) + ".");
    hf.add("model.norm.weight", norm_weight("decoder.final_layernorm.weight"));
    if (m_.untied) hf.add("lm_head.weight", vocab_rows("output_layer.weight"));
  }
  // The config.json entries the Llama-family classes share.
  nlohmann::ordered_json llama_family_config(const std::string& architecture, const std::string& type, int64_t ffn) {
    int64_t max_positions = m_.max_positions;
    const auto scaling = rope_scaling(m_.rotary, m_.positions == "yarn", &max_positions);
    return {{"architectures", {architecture}},
            {"model_type", type},
            {"vocab_size", m_.vocab},
            {"hidden_size", m_.hidden},
            {"intermediate_size", ffn},
            {"num_hidden_layers", m_.layers},
            {"num_attention_heads", m_.heads},
            {"num_key_value_heads", m_.groups},
            {"head_dim", m_.head_dim},
            {"hidden_act", "silu"},
            {"max_position_embeddings", max_positions},
            {"rms_norm_eps", m_.eps},
            {"rope_theta", m_.rotary_base},
            {"rope_scaling", scaling},
            {"attention_dropout", m_.attention_dropout},
            {"initializer_range", m_.std},
            {"tie_word_embeddings", !m_.untied},
            {"torch_dtype", hf_dtype_name(dtype_)}};
  }

  HfModel llama() {
    require_llama_attention("llama");
    const bool attention_bias = m_.qkv_bias || m_.bias_linear;
    HfModel hf;
    llama_family_body(hf, [&](int64_t, const std::string& p, const std::string& h) {
      llama_attention(hf, p, h, attention_bias, attention_bias);
      hf.add(h + "post_attention_layernorm.weight", norm_weight(p + "mlp.linear_fc1.layer_norm_weight"));
      swiglu_mlp(hf, p + "mlp.", h + "mlp.", m_.ffn, m_.bias_linear);
    });
    hf.config = llama_family_config("LlamaForCausalLM", "llama", m_.ffn);
    hf.config["attention_bias"] = attention_bias;
    hf.config["mlp_bias"] = m_.bias_linear;
    return hf;
  }

  // Qwen2ForCausalLM: Llama with biases on q, k and v only, and full attention (no window).
  HfModel qwen2() {
    const std::string f = "qwen2";
    require_llama_attention(f);
    require(m_.qkv_bias && !m_.bias_linear, f, "Qwen2's attention has q/k/v biases only (--add-qkv-bias --disable-bias-linear)");
    HfModel hf;
    llama_family_body(hf, [&](int64_t, const std::string& p, const std::string& h) {
      llama_attention(hf, p, h, true, false);
      hf.add(h + "post_attention_layernorm.weight", norm_weight(p + "mlp.linear_fc1.layer_norm_weight"));
      swiglu_mlp(hf, p + "mlp.", h + "mlp.", m_.ffn, false);
    });
    hf.config = llama_family_config("Qwen2ForCausalLM", "qwen2", m_.ffn);
    hf.config["use_sliding_window"] = false;
    hf.config["sliding_window"] = nullptr;
    hf.config["max_window_layers"] = m_.layers;
    return hf;
  }

  // MixtralForCausalLM: every layer a dropless MoE whose router keeps the softmax of the top-k
  // logits (= softmax over all experts, top k, renormalised: Megatron's default order).
  HfModel mixtral() {
    const std::string f = "mixtral";
    const MoeConfig& e = m_.moe;
    require_llama_attention(f);
    require_moe_inference(f);
    require_softmax_router(f);
    require(!m_.qkv_bias, f, "Mixtral's attention has no biases (--add-qkv-bias)");
    require(e.num_moe_layers() == m_.layers, f, "every Mixtral layer is a MoE layer (--moe-layer-freq leaves dense ones)");
    require(!e.pre_softmax, f, "Mixtral renormalises the top-k probabilities (--moe-router-pre-softmax keeps them as they are)");
    HfModel hf;
    llama_family_body(hf, [&](int64_t, const std::string& p, const std::string& h) {
      llama_attention(hf, p, h, false, false);
      hf.add(h + "post_attention_layernorm.weight", norm_weight(p + "pre_mlp_layernorm.weight"));
      hf.add(h + "block_sparse_moe.gate.weight", get(p + "mlp.router.weight"));
      routed_experts(hf, p + "mlp.", h + "block_sparse_moe.experts.", "w1", "w3", "w2");
    });
    hf.config = llama_family_config("MixtralForCausalLM", "mixtral", e.ffn_hidden_size);
    hf.config["num_local_experts"] = e.num_experts;
    hf.config["num_experts_per_tok"] = e.topk;
    hf.config["router_jitter_noise"] = 0.0;
    hf.config["sliding_window"] = nullptr;
    return hf;
  }

  // Qwen2MoeForCausalLM: q/k/v biases, MoE layers with a shared expert behind a sigmoid gate,
  // dense layers listed in mlp_only_layers. Without --moe-router-pre-softmax the router's softmax
  // over the top-k logits is the renormalised top-k (norm_topk_prob); with it, not renormalised.
  HfModel qwen2_moe() {
    const std::string f = "qwen2_moe";
    const MoeConfig& e = m_.moe;
    require_llama_attention(f);
    require_moe_inference(f);
    require_softmax_router(f);
    require(e.shared_expert_size > 0 && e.shared_expert_gate, f,
            "Qwen2-MoE's shared expert has a sigmoid gate (--moe-shared-expert-gate)");
    HfModel hf;
    nlohmann::ordered_json dense = nlohmann::ordered_json::array();
    llama_family_body(hf, [&](int64_t i, const std::string& p, const std::string& h) {
      llama_attention(hf, p, h, m_.qkv_bias, false);
      if (!e.is_moe_layer(i)) {
        dense.push_back(i);
        hf.add(h + "post_attention_layernorm.weight", norm_weight(p + "mlp.linear_fc1.layer_norm_weight"));
        swiglu_mlp(hf, p + "mlp.", h + "mlp.", m_.ffn, false);
        return;
      }
      hf.add(h + "post_attention_layernorm.weight", norm_weight(p + "pre_mlp_layernorm.weight"));
      hf.add(h + "mlp.gate.weight", get(p + "mlp.router.weight"));
      routed_experts(hf, p + "mlp.", h + "mlp.experts.", "gate_proj", "up_proj", "down_proj");
      swiglu_mlp(hf, p + "mlp.shared_experts.", h + "mlp.shared_expert.", e.shared_expert_size, false);
      hf.add(h + "mlp.shared_expert_gate.weight", get(p + "mlp.shared_experts.gate_weight"));
    });
    hf.config = llama_family_config("Qwen2MoeForCausalLM", "qwen2_moe", m_.ffn);
    hf.config["qkv_bias"] = m_.qkv_bias;
    hf.config["moe_intermediate_size"] = e.ffn_hidden_size;
    hf.config["shared_expert_intermediate_size"] = e.shared_expert_size;
    hf.config["num_experts"] = e.num_experts;
    hf.config["num_experts_per_tok"] = e.topk;
    hf.config["norm_topk_prob"] = !e.pre_softmax;
    hf.config["decoder_sparse_step"] = 1;
    hf.config["mlp_only_layers"] = dense;
    hf.config["use_sliding_window"] = false;
    hf.config["sliding_window"] = nullptr;
    hf.config["max_window_layers"] = m_.layers;
    return hf;
  }

  // DeepSeek-V3's MoE layers (DeepseekV3MoE) as fp8tron's: the dense layers come first
  // (first_k_dense_replace); the router scores with a sigmoid, selects on score + expert bias
  // (e_score_correction_bias) within the topk_group groups whose two best biased scores sum highest,
  // weighs by the unbiased scores, renormalised over the k (norm_topk_prob, k > 1) and times
  // routed_scaling_factor; n_shared_experts experts of moe_intermediate_size run beside, ungated.
  // Returns first_k_dense_replace.
  int64_t require_deepseek_moe(const std::string& f) {
    const MoeConfig& e = m_.moe;
    require_moe_inference(f);
    require(e.score_function == MoeScoreFunction::kSigmoid, f,
            "DeepSeek-V3's router scores with a sigmoid (--moe-router-score-function sigmoid), not a softmax");
    int64_t dense = 0;
    while (dense < m_.layers && !e.is_moe_layer(dense)) ++dense;
    require(e.num_moe_layers() == m_.layers - dense, f,
            "DeepSeek-V3's dense layers come first (--moe-layer-freq must be ([0]*k+[1]*rest))");
    require(e.shared_expert_size > 0 && e.shared_expert_size % e.ffn_hidden_size == 0, f,
            "DeepSeek-V3 has shared experts of --moe-ffn-hidden-size each (--moe-shared-expert-intermediate-size a multiple of it)");
    require(!e.shared_expert_gate, f, "DeepSeek-V3's shared experts have no gate (--moe-shared-expert-gate)");
    if (e.group_topk) {
      require(e.num_groups && e.num_experts % *e.num_groups == 0 && e.num_experts / *e.num_groups >= 2, f,
              "group-limited routing needs --moe-router-num-groups dividing --num-experts into groups of 2 or more");
      require(e.topk / *e.group_topk == 2, f,
              "transformers scores a group by the sum of its top-2 experts, fp8tron by its top (--moe-router-topk / "
              "--moe-router-group-topk): make that ratio 2");
    } else {
      require(e.num_experts >= 2, f, "DeepSeek-V3's router needs 2 or more experts");
    }
    return dense;
  }

  // The MoE part of DeepseekV3ForCausalLM's config.json (first_k_dense_replace = every layer and
  // placeholder sizes for a dense model).
  void deepseek_moe_config(HfModel& hf, int64_t dense) {
    const MoeConfig& e = m_.moe;
    if (!e.enabled()) {
      hf.config["moe_intermediate_size"] = m_.ffn;
      hf.config["first_k_dense_replace"] = m_.layers;  // no MoE layers
      return;
    }
    hf.config["moe_intermediate_size"] = e.ffn_hidden_size;
    hf.config["first_k_dense_replace"] = dense;
    hf.config["n_routed_experts"] = e.num_experts;
    hf.config["num_experts_per_tok"] = e.topk;
    hf.config["n_shared_experts"] = e.shared_expert_size / e.ffn_hidden_size;
    // Without group-limited routing all experts are one group (its top-2 then never matters).
    hf.config["n_group"] = e.group_topk ? *e.num_groups : 1;
    hf.config["topk_group"] = e.group_topk ? *e.group_topk : 1;
    hf.config["norm_topk_prob"] = e.topk > 1;  // fp8tron's sigmoid router renormalises over k > 1
    hf.config["routed_scaling_factor"] =
        e.topk_scaling_factor && *e.topk_scaling_factor != 0.0 ? *e.topk_scaling_factor : 1.0;
  }

  // Multi-latent attention as DeepseekV3Attention's projections (with or without the query
  // bottleneck q_lora_rank).
  void mla_attention(HfModel& hf, const std::string& p, const std::string& h) {
    const std::string att = p + "self_attention.";
    hf.add(h + "input_layernorm.weight", norm_weight(p + "input_layernorm.weight"));
    if (m_.mla.q_lora_rank) {
      hf.add(h + "self_attn.q_a_proj.weight", get(att + "linear_q_down_proj.weight"));
      hf.add(h + "self_attn.q_a_layernorm.weight", norm_weight(att + "linear_q_up_proj.layer_norm_weight"));
      hf.add(h + "self_attn.q_b_proj.weight", get(att + "linear_q_up_proj.weight"));
    } else {
      hf.add(h + "self_attn.q_proj.weight", get(att + "linear_q_proj.weight"));
    }
    hf.add(h + "self_attn.kv_a_proj_with_mqa.weight", get(att + "linear_kv_down_proj.weight"));
    hf.add(h + "self_attn.kv_a_layernorm.weight", norm_weight(att + "linear_kv_up_proj.layer_norm_weight"));
    hf.add(h + "self_attn.kv_b_proj.weight", get(att + "linear_kv_up_proj.weight"));
    hf.add(h + "self_attn.o_proj.weight", get(att + "linear_proj.weight"));
  }

  // DeepseekV3ForCausalLM: dense layers, then DeepseekV3MoE layers. Hugging Face de-interleaves
  // the rotary channels as Megatron's MLA does (rope_interleave), so no permutation.
  HfModel deepseek_v3() {
    const std::string f = "deepseek_v3";
    const MlaConfig& a = m_.mla;
    const MoeConfig& e = m_.moe;
    require(m_.rms_norm && m_.swiglu && !m_.bias_linear, f, "DeepSeek-V3 needs RMSNorm, SwiGLU and --disable-bias-linear");
    require(m_.qk_layernorm, f, "DeepSeek-V3 normalises its q and kv latents (--qk-layernorm)");
    require(!m_.learned_positions, f, "DeepSeek-V3 has no learned position embeddings");
    require(!m_.layernorm_1p, f, "--apply-layernorm-1p has no DeepSeek-V3 equivalent");
    require(a.yarn || m_.rotary.yarn.scaling_factor == 1.0, f,
            "--rope-type rope with --rotary-scaling-factor != 1 scales the softmax without YaRN; Hugging Face does not");
    const int64_t dense = e.enabled() ? require_deepseek_moe(f) : m_.layers;
    HfModel hf;
    // DeepseekV3Attention builds q_a_layernorm and kv_a_layernorm with DeepseekV3RMSNorm's default
    // eps (1e-6) instead of rms_norm_eps; Megatron's MLA norms take --norm-epsilon.
    if (std::abs(m_.eps - kHfLatentNormEps) > 1e-3 * kHfLatentNormEps)
      hf.notes.push_back(strprintf(
          "transformers' DeepseekV3 normalises the attention latents (q_a_layernorm and kv_a_layernorm with eps 1e-6, "
          "its RMSNorm default, not rms_norm_eps); this model was trained with --norm-epsilon %g there, so transformers' "
          "logits differ slightly from fp8tron's (train with --norm-epsilon 1e-6, as DeepSeek-V3 does, for an exact export)",
          m_.eps));
    hf.add("model.embed_tokens.weight", vocab_rows("embedding.word_embeddings.weight"));
    for (int64_t i = 0; i < m_.layers; ++i) {
      const std::string p = "decoder.layers." + std::to_string(i) + ".", h = "model.layers." + std::to_string(i) + ".";
      mla_attention(hf, p, h);
      if (!e.is_moe_layer(i)) {
        hf.add(h + "post_attention_layernorm.weight", norm_weight(p + "mlp.linear_fc1.layer_norm_weight"));
        swiglu_mlp(hf, p + "mlp.", h + "mlp.", m_.ffn, false);
        continue;
      }
      hf.add(h + "post_attention_layernorm.weight", norm_weight(p + "pre_mlp_layernorm.weight"));
      hf.add(h + "mlp.gate.weight", get(p + "mlp.router.weight"));
      // The bias steers the selection only; without --moe-router-enable-expert-bias it is zero.
      const std::string bias = p + "mlp.router.expert_bias";
      hf.add(h + "mlp.gate.e_score_correction_bias",
             s_.has(bias) ? s_.tensor(bias, torch::kFloat32) : torch::zeros({e.num_experts}, torch::kFloat32));
      routed_experts(hf, p + "mlp.", h + "mlp.experts.", "gate_proj", "up_proj", "down_proj");
      swiglu_mlp(hf, p + "mlp.shared_experts.", h + "mlp.shared_experts.", e.shared_expert_size, false);
    }
    hf.add("model.norm.weight", norm_weight("decoder.final_layernorm.weight"));
    if (m_.untied) hf.add("lm_head.weight", vocab_rows("output_layer.weight"));
    int64_t max_positions = m_.max_positions;
    // MLA's YaRN keeps the default original context (4096) and betas; only the factor and mscales come from flags.
    RotaryConfig rotary = m_.rotary;
    rotary.yarn = YarnConfig{};
    rotary.yarn.scaling_factor = m_.rotary.yarn.scaling_factor;
    rotary.yarn.mscale = m_.rotary.yarn.mscale;
    rotary.yarn.mscale_all_dim = m_.rotary.yarn.mscale_all_dim;
    rotary.llama3_scaling = false;
    const auto scaling = rope_scaling(rotary, a.yarn, &max_positions);
    hf.config = {{"architectures", {"DeepseekV3ForCausalLM"}},
                 {"model_type", "deepseek_v3"},
                 {"vocab_size", m_.vocab},
                 {"hidden_size", m_.hidden},
                 {"intermediate_size", m_.ffn},
                 {"num_hidden_layers", m_.layers},
                 {"num_attention_heads", m_.heads},
                 {"num_key_value_heads", m_.heads},
                 {"q_lora_rank", a.q_lora_rank ? nlohmann::ordered_json(*a.q_lora_rank) : nlohmann::ordered_json()},
                 {"kv_lora_rank", a.kv_lora_rank},
                 {"qk_nope_head_dim", a.qk_head_dim},
                 {"qk_rope_head_dim", a.qk_pos_emb_head_dim},
                 {"v_head_dim", a.v_head_dim},
                 {"rope_interleave", true},
                 {"hidden_act", "silu"},
                 {"max_position_embeddings", max_positions},
                 {"rms_norm_eps", m_.eps},
                 {"rope_theta", m_.rotary_base},
                 {"rope_scaling", scaling},
                 {"attention_bias", false},
                 {"attention_dropout", m_.attention_dropout},
                 {"initializer_range", m_.std},
                 {"tie_word_embeddings", !m_.untied},
                 {"torch_dtype", hf_dtype_name(dtype_)}};
    deepseek_moe_config(hf, dense);
    return hf;
  }

 private:
  Source& s_;
  const Model& m_;
  torch::ScalarType dtype_;
};

torch::ScalarType output_dtype(const std::string& option, const Source& s) {
  if (option == "fp32") return torch::kFloat32;
  if (option == "bf16") return torch::kBFloat16;
  if (option == "fp16") return torch::kFloat16;
  if (option != "auto") throw UserError("--dtype " + option + ": choose auto, fp32, bf16 or fp16");
  auto it = s.metadata().tensors.find("embedding.word_embeddings.weight");
  return it == s.metadata().tensors.end() ? torch::kFloat32 : torch_dtype(it->second.dtype);
}

// fp8tron's own logits for `tokens` random token ids, with the weights as exported (rounded to
// the export dtype), computed in fp32 on the CPU: the reference a transformers run must match.
void write_reference_logits(Source& s, const Model& m, torch::ScalarType dtype, int64_t tokens, const std::string& path) {
  ModelConfig c;
  c.num_layers = m.layers;
  c.hidden_size = m.hidden;
  c.ffn_hidden_size = m.ffn;
  c.num_attention_heads = m.heads;
  c.kv_channels = m.head_dim;
  c.num_query_groups = m.groups;
  c.seq_length = std::max(m.seq_length, tokens);
  c.max_position_embeddings = m.max_positions;
  c.position_embedding = m.positions == "learned_absolute" ? PositionEmbedding::LearnedAbsolute
                         : m.positions == "yarn"           ? PositionEmbedding::Yarn
                         : m.positions == "none"           ? PositionEmbedding::None
                                                           : PositionEmbedding::Rope;
  c.squared_relu = m.squared_relu;
  c.rotary = m.rotary;
  c.mla = m.mla;  // (the MTP layers are not exported and not needed for the logits)
  c.rotary_base = m.rotary_base;
  c.rotary_percent = m.rotary_percent;
  c.normalization = m.rms_norm ? Normalization::RMSNorm : Normalization::LayerNorm;
  c.norm_epsilon = m.eps;
  c.apply_layernorm_1p = m.layernorm_1p;
  c.swiglu = m.swiglu;
  c.add_bias_linear = m.bias_linear;
  c.add_qkv_bias = m.qkv_bias;
  c.untie_embeddings_and_output_weights = m.untied;
  c.attention_dropout = c.hidden_dropout = 0;
  c.vocab_size = m.vocab;
  c.padded_vocab_size = m.padded_vocab;
  c.qk_layernorm = m.qk_layernorm;
  c.moe = m.moe;
  if (m.learned_positions && tokens > m.max_positions)
    throw UserError(strprintf("--reference-tokens %lld exceeds the model's %lld positions", (long long)tokens,
                              (long long)m.max_positions));
  torch::NoGradGuard no_grad;
  GptModel model(c);
  model->eval();
  for (auto& item : model->named_parameters()) item.value().copy_(s.tensor(item.key(), dtype).to(torch::kFloat32));
  // The routers' expert bias, as exported (fp32).
  for (auto& item : model->named_buffers())
    if (s.has(item.key())) item.value().copy_(s.tensor(item.key(), torch::kFloat32));
  auto generator = at::make_generator<at::CPUGeneratorImpl>(1234);
  auto ids = torch::randint(0, m.vocab, {1, tokens}, generator, torch::kInt64);
  auto logits = model->forward(ids).narrow(-1, 0, m.vocab).contiguous();
  std::vector<ck::TensorToWrite> out = {{"input_ids", ck::DType::I64, ids.sizes().vec(), ids.data_ptr(), {}},
                                        {"logits", ck::DType::F32, logits.sizes().vec(), logits.data_ptr(), {}}};
  ck::write_safetensors(path, out, {{"format", "pt"}});
}

}  // namespace

ExportResult export_hugging_face(const ExportOptions& o) {
  if (o.load.empty()) throw UserError("--load is required: the checkpoint directory to export");
  if (o.output.empty()) throw UserError("--output is required: the Hugging Face directory to write");
  const ck::CheckpointLocation location =
      o.ckpt_step ? ck::locate_checkpoint(o.load, *o.ckpt_step) : ck::locate_latest_checkpoint(o.load);
  Source source(location);
  const Model model = read_model(source);
  ExportResult result;
  result.iteration = location.iteration;
  result.format = o.format == "auto" ? detect_format(model) : o.format;
  static const std::set<std::string> kFormats = {"gpt2", "llama", "qwen2", "mixtral", "qwen2_moe", "deepseek_v3"};
  if (!kFormats.count(result.format))
    throw UserError("--format " + o.format + ": choose auto, gpt2, llama, qwen2, mixtral, qwen2_moe or deepseek_v3");
  const std::string detected = detect_format(model);
  // A Qwen2-style model may also go out as Llama (with zero o_proj biases), as before Qwen2 existed.
  if (result.format != detected && !(result.format == "llama" && detected == "qwen2"))
    throw UserError("--format " + result.format + " does not match this model, which is " + detected + "-style");
  const torch::ScalarType converter_dtype = output_dtype(o.dtype, source);
  Converter converter(source, model, converter_dtype);
  const std::string& f = result.format;
  HfModel hf = f == "gpt2"        ? converter.gpt2()
               : f == "llama"     ? converter.llama()
               : f == "qwen2"     ? converter.qwen2()
               : f == "mixtral"   ? converter.mixtral()
               : f == "qwen2_moe" ? converter.qwen2_moe()
                                  : converter.deepseek_v3();
  // Hugging Face's classes have no multi-token-prediction heads: they are left out.
  result.skipped_mtp_layers = model.mtp_layers;
  result.notes = hf.notes;

  std::error_code ec;
  std::filesystem::create_directories(o.output, ec);
  if (ec) throw UserError("cannot create " + o.output + ": " + ec.message());
  std::vector<ck::TensorToWrite> tensors;
  for (const auto& [name, t] : hf.tensors)
    tensors.push_back(ck::TensorToWrite{name, checkpoint_dtype(t.scalar_type()), t.sizes().vec(), t.data_ptr(), {}});
  result.bytes = ck::write_safetensors(o.output + "/model.safetensors", tensors, {{"format", "pt"}}).bytes;
  result.tensors = int64_t(tensors.size());
  ck::write_file_atomically(o.output + "/config.json", hf.config.dump(2) + "\n");
  if (o.reference_tokens > 0)
    write_reference_logits(source, model, converter_dtype, o.reference_tokens, o.output + "/fp8tron_reference.safetensors");
  return result;
}

}  // namespace fp8tron
