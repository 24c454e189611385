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
#include "models/gpt_model.h"
#include "trainer/cli/config_builder.h"
#include "trainer/cli/flags.h"
#include "trainer/export/hf_layout.h"
#include "trainer/export/hf_model_flags.h"

namespace fp8tron {
namespace {
namespace ck = checkpoint;
using nlohmann::json;
using hf::ModelFlags;
using hf::model_flags;
using hf::read_json;

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
