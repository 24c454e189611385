// fp8tron-export: a trained checkpoint becomes a Hugging Face directory whose weights, run through
// Hugging Face's GPT2LMHeadModel / LlamaForCausalLM computation (written out below from
// transformers' modeling code: Conv1D, split q/k/v, rotate-half RoPE, repeat_kv, RMSNorm), give
// fp8tron's logits. (Where transformers is installed, scripts/check_hf_export.py runs the same
// check against transformers itself.)
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "tests/checkpoint/temp_dir.h"
#include "models/gpt_model.h"
#include "tests/test_helpers.h"
#include "checkpoint/checkpoint_dir.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/sharded_io.h"
#include "trainer/export/hf_export.h"
#include "trainer/trainer.h"

namespace fp8tron {
namespace {
using namespace fp8tron::testing;
using checkpoint::testing::TempDir;
using Weights = std::map<std::string, torch::Tensor>;

Weights read_safetensors(const std::string& path) {
  auto file = checkpoint::SafetensorsFile::open(path);
  Weights out;
  for (const auto& t : file.tensors()) {
    const auto dtype = t.dtype == checkpoint::DType::BF16 ? torch::kBFloat16
                       : t.dtype == checkpoint::DType::F16 ? torch::kFloat16 : torch::kFloat32;
    auto tensor = torch::empty(t.shape, torch::TensorOptions().dtype(dtype));
    std::memcpy(tensor.data_ptr(), t.data, t.nbytes);
    out[t.name] = tensor.to(torch::kFloat32);
  }
  return out;
}

nlohmann::json read_json(const std::string& path) { return nlohmann::json::parse(checkpoint::testing::slurp(path)); }

torch::Tensor causal_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v) {
  const int64_t s = q.size(2);
  auto scores = torch::matmul(q, k.transpose(-1, -2)) / std::sqrt(double(q.size(-1)));
  auto mask = torch::ones({s, s}, torch::kBool).triu(1);
  return torch::matmul(scores.masked_fill(mask, -INFINITY).softmax(-1), v);
}

// transformers' GPT2LMHeadModel forward (eval).
torch::Tensor hf_gpt2_logits(Weights& w, const nlohmann::json& c, const torch::Tensor& ids) {
  const int64_t b = ids.size(0), s = ids.size(1), H = c["n_embd"], nh = c["n_head"], d = H / nh;
  const double eps = c["layer_norm_epsilon"];
  const std::string act = c["activation_function"];
  EXPECT_TRUE(act == "gelu_new" || act == "relu2") << act;
  auto ln = [&](const torch::Tensor& x, const std::string& p) {
    return torch::layer_norm(x, {H}, w.at(p + ".weight"), w.at(p + ".bias"), eps);
  };
  auto conv1d = [&](const torch::Tensor& x, const std::string& p) { return torch::addmm(w.at(p + ".bias"), x.reshape({-1, x.size(-1)}), w.at(p + ".weight")).view({b, s, -1}); };
  auto h = w.at("transformer.wte.weight").index_select(0, ids.reshape({-1})).view({b, s, H}) +
           w.at("transformer.wpe.weight").narrow(0, 0, s);
  for (int64_t i = 0; i < int64_t(c["n_layer"]); ++i) {
    const std::string p = "transformer.h." + std::to_string(i);
    auto qkv = conv1d(ln(h, p + ".ln_1"), p + ".attn.c_attn").split(H, 2);
    auto heads = [&](const torch::Tensor& t) { return t.view({b, s, nh, d}).transpose(1, 2); };
    auto a = causal_attention(heads(qkv[0]), heads(qkv[1]), heads(qkv[2])).transpose(1, 2).reshape({b, s, H});
    h = h + conv1d(a, p + ".attn.c_proj");
    auto fc = conv1d(ln(h, p + ".ln_2"), p + ".mlp.c_fc");
    auto m = act == "relu2" ? torch::relu(fc).square() : torch::gelu(fc, "tanh");
    h = h + conv1d(m, p + ".mlp.c_proj");
  }
  h = ln(h, "transformer.ln_f");
  const auto& head = c["tie_word_embeddings"].get<bool>() ? w.at("transformer.wte.weight") : w.at("lm_head.weight");
  return torch::matmul(h, head.t());
}

// transformers' rotary frequencies (modeling_rope_utils: default, llama3, yarn) and the cos/sin
// attention factor, in fp64.
std::pair<torch::Tensor, double> hf_inv_freq(const nlohmann::json& c, int64_t d, int64_t* max_positions) {
  const double theta = c["rope_theta"];
  auto inv_freq = 1.0 / torch::pow(theta, torch::arange(0, d, 2, torch::kFloat64) / double(d));
  const auto& r = c["rope_scaling"];
  if (r.is_null()) return {inv_freq, 1.0};
  const std::string type = r["rope_type"];
  const double factor = r["factor"];
  if (type == "llama3") {
    const double old = r["original_max_position_embeddings"], low_f = r["low_freq_factor"], high_f = r["high_freq_factor"];
    auto wavelen = 2 * M_PI / inv_freq;
    auto llama = torch::where(wavelen > old / low_f, inv_freq / factor, inv_freq);
    auto smooth = (old / wavelen - low_f) / (high_f - low_f);
    auto smoothed = (1 - smooth) * llama / factor + smooth * llama;
    auto medium = (wavelen < old / high_f).logical_not().logical_and((wavelen > old / low_f).logical_not());
    return {torch::where(medium, smoothed, llama), 1.0};
  }
  EXPECT_EQ(type, "yarn");
  const double original = r["original_max_position_embeddings"];
  *max_positions = int64_t(c["max_position_embeddings"]);
  EXPECT_DOUBLE_EQ(double(*max_positions) / original, factor);  // transformers derives the factor so
  auto dim_for = [&](double rotations) { return d * std::log(original / (rotations * 2 * M_PI)) / (2 * std::log(theta)); };
  double low = std::floor(dim_for(r["beta_fast"])), high = std::ceil(dim_for(r["beta_slow"]));
  low = std::max(low, 0.0);
  high = std::min(high, double(d - 1));
  if (low == high) high += 0.001;
  auto extrapolation = 1 - ((torch::arange(d / 2, torch::kFloat64) - low) / (high - low)).clamp(0, 1);
  auto interpolation = inv_freq / factor;
  return {interpolation * (1 - extrapolation) + inv_freq * extrapolation, r["attention_factor"].get<double>()};
}

// transformers' LlamaForCausalLM forward (eval).
torch::Tensor hf_llama_logits(Weights& w, const nlohmann::json& c, const torch::Tensor& ids) {
  const int64_t b = ids.size(0), s = ids.size(1), H = c["hidden_size"], nh = c["num_attention_heads"],
                ng = c["num_key_value_heads"], d = c["head_dim"];
  const double eps = c["rms_norm_eps"], theta = c["rope_theta"];
  EXPECT_EQ(c["hidden_act"], "silu");
  auto rms = [&](const torch::Tensor& x, const std::string& p) {
    return w.at(p + ".weight") * (x * torch::rsqrt(x.pow(2).mean(-1, true) + eps));
  };
  auto linear = [&](const torch::Tensor& x, const std::string& p) {
    auto y = torch::matmul(x, w.at(p + ".weight").t());
    return w.count(p + ".bias") ? y + w.at(p + ".bias") : y;
  };
  int64_t unused = 0;
  auto [inv_freq, attention_factor] = hf_inv_freq(c, d, &unused);
  (void)theta;
  auto freqs = torch::outer(torch::arange(s, torch::kFloat64), inv_freq);
  auto emb = torch::cat({freqs, freqs}, -1);
  auto cos = (emb.cos() * attention_factor).to(torch::kFloat32), sin = (emb.sin() * attention_factor).to(torch::kFloat32);
  auto rotate_half = [&](const torch::Tensor& x) { return torch::cat({-x.narrow(-1, d / 2, d / 2), x.narrow(-1, 0, d / 2)}, -1); };
  auto rope = [&](const torch::Tensor& x) { return x * cos + rotate_half(x) * sin; };
  auto h = w.at("model.embed_tokens.weight").index_select(0, ids.reshape({-1})).view({b, s, H});
  for (int64_t i = 0; i < int64_t(c["num_hidden_layers"]); ++i) {
    const std::string p = "model.layers." + std::to_string(i);
    auto x = rms(h, p + ".input_layernorm");
    auto q = rope(linear(x, p + ".self_attn.q_proj").view({b, s, nh, d}).transpose(1, 2));
    auto k = rope(linear(x, p + ".self_attn.k_proj").view({b, s, ng, d}).transpose(1, 2));
    auto v = linear(x, p + ".self_attn.v_proj").view({b, s, ng, d}).transpose(1, 2);
    // repeat_kv: each key/value head serves nh / ng consecutive query heads.
    k = k.unsqueeze(2).expand({b, ng, nh / ng, s, d}).reshape({b, nh, s, d});
    v = v.unsqueeze(2).expand({b, ng, nh / ng, s, d}).reshape({b, nh, s, d});
    auto a = causal_attention(q, k, v).transpose(1, 2).reshape({b, s, nh * d});
    h = h + linear(a, p + ".self_attn.o_proj");
    auto m = rms(h, p + ".post_attention_layernorm");
    h = h + linear(torch::silu(linear(m, p + ".mlp.gate_proj")) * linear(m, p + ".mlp.up_proj"), p + ".mlp.down_proj");
  }
  h = rms(h, "model.norm");
  const auto& head = c["tie_word_embeddings"].get<bool>() ? w.at("model.embed_tokens.weight") : w.at("lm_head.weight");
  return torch::matmul(h, head.t());
}

// transformers' DeepseekV3ForCausalLM forward (eval; dense layers): multi-latent attention with
// the rotary channels de-interleaved (rope_interleave), YaRN cos/sin factor and softmax scale. Its
// q_a_layernorm and kv_a_layernorm are built with DeepseekV3RMSNorm's default eps, 1e-6, not
// rms_norm_eps (checked with transformers 5.23).
torch::Tensor hf_deepseek_v3_logits(Weights& w, const nlohmann::json& c, const torch::Tensor& ids) {
  const int64_t b = ids.size(0), s = ids.size(1), H = c["hidden_size"], nh = c["num_attention_heads"];
  const int64_t dn = c["qk_nope_head_dim"], dr = c["qk_rope_head_dim"], dv = c["v_head_dim"], kv_lora = c["kv_lora_rank"];
  const double eps = c["rms_norm_eps"];
  EXPECT_EQ(c["first_k_dense_replace"], c["num_hidden_layers"]);
  EXPECT_TRUE(c["rope_interleave"].get<bool>());
  auto rms = [&](const torch::Tensor& x, const std::string& p, double e) {
    return w.at(p + ".weight") * (x * torch::rsqrt(x.pow(2).mean(-1, true) + e));
  };
  constexpr double kLatentEps = 1e-6;
  auto linear = [&](const torch::Tensor& x, const std::string& p) { return torch::matmul(x, w.at(p + ".weight").t()); };
  int64_t max_positions = 0;
  auto [inv_freq, attention_factor] = hf_inv_freq(c, dr, &max_positions);
  auto freqs = torch::outer(torch::arange(s, torch::kFloat64), inv_freq);
  auto emb = torch::cat({freqs, freqs}, -1);
  auto cos = (emb.cos() * attention_factor).to(torch::kFloat32), sin = (emb.sin() * attention_factor).to(torch::kFloat32);
  auto rotate_half = [&](const torch::Tensor& x) { return torch::cat({-x.narrow(-1, dr / 2, dr / 2), x.narrow(-1, 0, dr / 2)}, -1); };
  auto rope_interleave = [&](const torch::Tensor& x) {  // [b, h, s, dr]: evens, then odds; then rotate-half
    auto y = x.view({x.size(0), x.size(1), s, dr / 2, 2}).transpose(4, 3).reshape({x.size(0), x.size(1), s, dr});
    return y * cos + rotate_half(y) * sin;
  };
  double scaling = 1.0 / std::sqrt(double(dn + dr));
  const auto& r = c["rope_scaling"];
  if (!r.is_null() && r["mscale_all_dim"].get<double>() != 0) {
    const double factor = r["factor"], m = 0.1 * r["mscale_all_dim"].get<double>() * std::log(factor) + 1.0;
    scaling *= m * m;
  }
  auto h = w.at("model.embed_tokens.weight").index_select(0, ids.reshape({-1})).view({b, s, H});
  for (int64_t i = 0; i < int64_t(c["num_hidden_layers"]); ++i) {
    const std::string p = "model.layers." + std::to_string(i), a = p + ".self_attn";
    auto x = rms(h, p + ".input_layernorm", eps);
    auto q = linear(rms(linear(x, a + ".q_a_proj"), a + ".q_a_layernorm", kLatentEps), a + ".q_b_proj").view({b, s, nh, dn + dr}).transpose(1, 2);
    auto compressed = linear(x, a + ".kv_a_proj_with_mqa");
    auto kv = linear(rms(compressed.narrow(-1, 0, kv_lora), a + ".kv_a_layernorm", kLatentEps), a + ".kv_b_proj")
                  .view({b, s, nh, dn + dv}).transpose(1, 2);
    auto k_rot = rope_interleave(compressed.narrow(-1, kv_lora, dr).view({b, 1, s, dr})).expand({b, nh, s, dr});
    auto query = torch::cat({q.narrow(-1, 0, dn), rope_interleave(q.narrow(-1, dn, dr))}, -1);
    auto key = torch::cat({kv.narrow(-1, 0, dn), k_rot}, -1);
    auto scores = torch::matmul(query, key.transpose(-1, -2)) * scaling;
    scores = scores.masked_fill(torch::ones({s, s}, torch::kBool).triu(1), -INFINITY);
    auto out = torch::matmul(scores.softmax(-1), kv.narrow(-1, dn, dv)).transpose(1, 2).reshape({b, s, nh * dv});
    h = h + linear(out, a + ".o_proj");
    auto m = rms(h, p + ".post_attention_layernorm", eps);
    h = h + linear(torch::silu(linear(m, p + ".mlp.gate_proj")) * linear(m, p + ".mlp.up_proj"), p + ".mlp.down_proj");
  }
  h = rms(h, "model.norm", eps);
  const auto& head = c["tie_word_embeddings"].get<bool>() ? w.at("model.embed_tokens.weight") : w.at("lm_head.weight");
  return torch::matmul(h, head.t());
}

// fp8tron's logits for the checkpoint's weights (one process, fp32).
torch::Tensor fp8tron_logits(const Config& c, const std::string& dir, const torch::Tensor& ids) {
  torch::NoGradGuard no_grad;
  GptModel model(c.model);
  model->eval();
  checkpoint::CheckpointReader reader(checkpoint::locate_latest_checkpoint(dir));
  for (auto& item : model->named_parameters()) {
    const std::string main = "optimizer.state.fp32_param." + item.key();
    const std::string name = reader.has_tensor(main) ? main : item.key();
    auto t = torch::empty(item.value().sizes(), torch::kFloat32);
    reader.read(name, checkpoint::DType::F32, t.sizes().vec(), checkpoint::whole(t.sizes().vec()), t.data_ptr());
    item.value().copy_(t);
  }
  return model->forward(ids).narrow(-1, 0, c.model.vocab_size);
}

Config export_config(const std::vector<std::string>& model) {
  auto args = tiny_args({"--num-layers", "2", "--global-batch-size", "4", "--lr", "1e-2", "--log-interval", "1000",
                         "--eval-iters", "0", "--train-iters", "3", "--hidden-dropout", "0", "--attention-dropout", "0"});
  args.insert(args.end(), model.begin(), model.end());
  return build(args);
}

double relative(const torch::Tensor& a, const torch::Tensor& b) { return ((a - b).norm() / b.norm()).item<double>(); }

void check_export(const std::vector<std::string>& model, const std::string& format, const std::string& dtype = "auto") {
  TempDir ckpt, out;
  std::vector<std::string> saving = model;
  saving.insert(saving.end(), {"--save", ckpt.path()});
  const Config c = export_config(saving);
  train(c);
  ExportResult r = export_hugging_face(ExportOptions{ckpt.path(), {}, out.path(), "auto", dtype});
  EXPECT_EQ(r.format, format);
  EXPECT_EQ(r.iteration, 3);
  Weights w = read_safetensors(out / "model.safetensors");
  const nlohmann::json config = read_json(out / "config.json");
  EXPECT_EQ(config["model_type"], format);
  EXPECT_EQ(config["vocab_size"], c.model.vocab_size);  // the padded rows are cut
  const auto ids = torch::randint(0, c.model.vocab_size, {2, 16}, torch::kInt64);
  Config plain = c;
  plain.model.mtp.num_layers = 0;  // the MTP heads are not exported and do not change the logits
  const auto ours = fp8tron_logits(plain, ckpt.path(), ids);
  // Qwen2ForCausalLM computes as Llama with biases on q, k and v.
  const auto theirs = format == "gpt2"                          ? hf_gpt2_logits(w, config, ids)
                      : format == "llama" || format == "qwen2" ? hf_llama_logits(w, config, ids)
                                                                : hf_deepseek_v3_logits(w, config, ids);
  ASSERT_EQ(ours.sizes(), theirs.sizes());
  EXPECT_LT(relative(theirs, ours), dtype == "bf16" ? 2e-2 : 1e-5);
}

TEST(HfExport, Gpt2StyleGivesTheSameLogits) { check_export({}, "gpt2"); }

TEST(HfExport, Gpt2StyleZeroCentredGammaUntiedNoBias) {
  check_export({"--apply-layernorm-1p", "--untie-embeddings-and-output-weights", "--disable-bias-linear"}, "gpt2");
}

TEST(HfExport, LlamaStyleGivesTheSameLogits) {
  check_export({"--swiglu", "--normalization", "RMSNorm", "--position-embedding-type", "rope", "--disable-bias-linear",
                "--group-query-attention", "--num-query-groups", "2", "--untie-embeddings-and-output-weights"},
               "llama");
}

// Biases on q, k and v only go out as Qwen2ForCausalLM.
TEST(HfExport, LlamaStyleFromBf16WithQkvBiasAndTiedEmbeddings) {
  check_export({"--bf16", "--swiglu", "--normalization", "RMSNorm", "--position-embedding-type", "rope",
                "--disable-bias-linear", "--add-qkv-bias", "--group-query-attention", "--num-query-groups", "2"},
               "qwen2", "fp32");
  check_export({"--bf16", "--swiglu", "--normalization", "RMSNorm", "--position-embedding-type", "rope"}, "llama", "bf16");
}

// Llama 3.1 frequency scaling with RoFormer-interleaved rotary channels (exported as rotate-half
// by permuting q and k rows), and YaRN; GPT-2 with squared ReLU ("relu2").
TEST(HfExport, RotaryVariantsAndSquaredRelu) {
  const std::vector<std::string> llama = {"--swiglu", "--normalization", "RMSNorm", "--disable-bias-linear",
                                          "--untie-embeddings-and-output-weights"};
  auto with = [&](std::initializer_list<std::string> extra) {
    auto a = llama;
    a.insert(a.end(), extra);
    return a;
  };
  check_export(with({"--position-embedding-type", "rope", "--use-rope-scaling", "--rope-scaling-factor", "4",
                     "--rotary-base", "500000", "--rotary-interleaved"}),
               "llama");
  check_export(with({"--position-embedding-type", "yarn", "--rotary-scaling-factor", "4", "--mscale", "0.7",
                     "--yarn-original-max-position-embeddings", "8"}),
               "llama");
  check_export({"--squared-relu", "--disable-bias-linear"}, "gpt2");
}

// Multi-latent attention with YaRN (and one MTP layer, not exported) as DeepseekV3ForCausalLM,
// with DeepSeek-V3's --norm-epsilon 1e-6: transformers' latent norms use that eps whatever
// rms_norm_eps says, so only then is the export exact.
const std::vector<std::string> kDeepseekFlags = {
    "--multi-latent-attention", "--q-lora-rank", "24", "--kv-lora-rank", "16", "--qk-head-dim", "8",
    "--qk-pos-emb-head-dim", "8", "--v-head-dim", "8", "--qk-layernorm", "--rotary-scaling-factor", "4",
    "--mscale", "1", "--mscale-all-dim", "1", "--position-embedding-type", "rope", "--normalization", "RMSNorm",
    "--swiglu", "--disable-bias-linear", "--untie-embeddings-and-output-weights", "--mtp-num-layers", "1"};

TEST(HfExport, MultiLatentAttentionAsDeepseekV3) {
  auto flags = kDeepseekFlags;
  flags.insert(flags.end(), {"--norm-epsilon", "1e-6"});
  check_export(flags, "deepseek_v3");
}

// Another --norm-epsilon exports too (the other norms take rms_norm_eps), with a note saying that
// transformers' latent norms differ slightly from the trained model's.
TEST(HfExport, DeepseekV3LatentNormEpsilonIsNoted) {
  TempDir ckpt, out, exact_ckpt, exact_out;
  auto flags = kDeepseekFlags;
  flags.insert(flags.end(), {"--save", ckpt.path()});
  train(export_config(flags));
  const ExportResult r = export_hugging_face(ExportOptions{ckpt.path(), {}, out.path()});
  ASSERT_EQ(r.notes.size(), 1u);
  EXPECT_NE(r.notes[0].find("q_a_layernorm and kv_a_layernorm with eps 1e-6"), std::string::npos) << r.notes[0];
  EXPECT_NE(r.notes[0].find("--norm-epsilon 1e-05"), std::string::npos) << r.notes[0];
  EXPECT_EQ(read_json(out / "config.json")["rms_norm_eps"], 1e-5);
  flags = kDeepseekFlags;
  flags.insert(flags.end(), {"--norm-epsilon", "1e-6", "--save", exact_ckpt.path()});
  train(export_config(flags));
  EXPECT_TRUE(export_hugging_face(ExportOptions{exact_ckpt.path(), {}, exact_out.path()}).notes.empty());
}

TEST(HfExport, ReferenceLogitsForTheTransformersCheck) {
  TempDir ckpt, out;
  const Config c = export_config({"--swiglu", "--normalization", "RMSNorm", "--position-embedding-type", "rope",
                                  "--group-query-attention", "--num-query-groups", "2", "--bf16", "--save", ckpt.path()});
  train(c);
  ExportOptions o{ckpt.path(), {}, out.path()};
  o.reference_tokens = 12;
  export_hugging_face(o);
  Weights w = read_safetensors(out / "model.safetensors");
  auto file = checkpoint::SafetensorsFile::open(out / "fp8tron_reference.safetensors");
  const auto& ids_view = file.at("input_ids");
  ASSERT_EQ(ids_view.shape, (std::vector<int64_t>{1, 12}));
  auto ids = torch::from_blob(const_cast<std::byte*>(ids_view.data), {1, 12}, torch::kInt64).clone();
  const auto& logits_view = file.at("logits");
  auto logits = torch::from_blob(const_cast<std::byte*>(logits_view.data), logits_view.shape, torch::kFloat32).clone();
  // The reference uses the exported (bf16) weights: Hugging Face's computation matches it closely.
  EXPECT_LT(relative(hf_llama_logits(w, read_json(out / "config.json"), ids), logits), 1e-5);
}

TEST(HfExport, ModelsHuggingFaceCannotExpressAreClearErrors) {
  TempDir ckpt, out;
  train(export_config({"--swiglu", "--save", ckpt.path()}));  // learned positions + SwiGLU
  EXPECT_USER_ERROR(export_hugging_face(ExportOptions{ckpt.path(), {}, out.path()}), "neither GPT-2-style");
  TempDir ckpt2;
  train(export_config({"--group-query-attention", "--num-query-groups", "2", "--save", ckpt2.path()}));
  EXPECT_USER_ERROR(export_hugging_face(ExportOptions{ckpt2.path(), {}, out.path()}), "grouped-query attention");
  EXPECT_USER_ERROR(export_hugging_face(ExportOptions{out.path() + "/nothing", {}, out.path()}), "nothing");
  // A MoE model goes out as Mixtral, Qwen2-MoE or DeepSeek-V3 only; --format names the class.
  TempDir moe, moe_out;
  train(export_config({"--swiglu", "--normalization", "RMSNorm", "--position-embedding-type", "rope", "--disable-bias-linear",
                       "--num-experts", "4", "--moe-ffn-hidden-size", "16", "--save", moe.path()}));
  EXPECT_USER_ERROR(export_hugging_face(ExportOptions{moe.path(), {}, moe_out.path(), "llama"}), "mixtral-style");
  EXPECT_EQ(export_hugging_face(ExportOptions{moe.path(), {}, moe_out.path()}).format, "mixtral");
}

// A Qwen2-style model may still be written as LlamaForCausalLM (zero o_proj biases), as before.
TEST(HfExport, QwenStyleAsLlamaOnRequest) {
  TempDir ckpt, out;
  train(export_config({"--swiglu", "--normalization", "RMSNorm", "--position-embedding-type", "rope",
                       "--disable-bias-linear", "--add-qkv-bias", "--save", ckpt.path()}));
  EXPECT_EQ(export_hugging_face(ExportOptions{ckpt.path(), {}, out.path(), "llama"}).format, "llama");
  const auto config = read_json(out / "config.json");
  EXPECT_EQ(config["architectures"][0], "LlamaForCausalLM");
  Weights w = read_safetensors(out / "model.safetensors");
  EXPECT_TRUE(torch::equal(w.at("model.layers.0.self_attn.o_proj.bias"), torch::zeros({32})));
}

}  // namespace
}  // namespace fp8tron
