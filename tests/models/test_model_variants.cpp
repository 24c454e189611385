// Model variants against hand or reference computations: rotary frequencies (Llama 3.1, YaRN;
// values computed with Megatron's formulas), the rotation layouts, squared ReLU, multi-latent
// attention and gated attention (forward recomputed from their weights by the formulas),
// multi-token prediction (its objective and gradients against the loss written out by hand), their
// parameter counts.
#include <gtest/gtest.h>

#include <cmath>

#include "models/gpt_model.h"
#include "models/attention/mla_attention.h"
#include "models/mtp.h"
#include "models/attention/rotary.h"
#include "tests/test_helpers.h"
#include "trainer/cli/model_math.h"

namespace fp8tron {
using namespace fp8tron::testing;
namespace F = torch::nn::functional;

ModelConfig variant_config(std::initializer_list<std::string> extra) {
  auto args = tiny_args({"--attention-dropout", "0", "--hidden-dropout", "0"});
  args.insert(args.end(), extra.begin(), extra.end());
  return build(args).model;
}

// Megatron's _apply_scaling (head dim 128, base 500000, factor 8): Llama 3.1's values.
TEST(Rotary, Llama3FrequenciesMatchMegatron) {
  RotarySpec s;
  s.dim = 128;
  s.base = 500000;
  auto plain = rotary_inv_freq(s);
  s.scaling = RotaryScaling::Llama3;
  s.llama3_factor = 8;
  auto scaled = rotary_inv_freq(s);
  EXPECT_NEAR(plain[30].item<float>(), 2.1311195e-3, 1e-9);
  EXPECT_NEAR(scaled[30].item<float>(), 1.3718936e-3, 1e-9);   // the smoothed band
  EXPECT_NEAR(scaled[35].item<float>(), 9.556212e-5, 1e-10);   // low frequencies / 8
  EXPECT_FLOAT_EQ(scaled[20].item<float>(), plain[20].item<float>());  // high frequencies kept
  EXPECT_NEAR(plain[20].item<float>(), 1.6560440e-2, 1e-8);
  EXPECT_NEAR(scaled[63].item<float>(), 3.0689260e-7, 1e-12);
  s.llama3_factor = 16;  // fp8tron honours --rope-scaling-factor
  EXPECT_NEAR(rotary_inv_freq(s)[63].item<float>(), 2.4551408e-6 / 16, 1e-12);
}

// YaRN (d 64, base 1e4, s 40, original 4096): low/high 10 and 23 after rounding.
TEST(Rotary, YarnFrequenciesAndScalesMatchMegatron) {
  RotarySpec s;
  s.dim = 64;
  s.scaling = RotaryScaling::Yarn;
  s.yarn.scaling_factor = 40;
  auto f = rotary_inv_freq(s);
  EXPECT_NEAR(f[11].item<float>(), 0.039006927, 1e-8);
  EXPECT_NEAR(f[16].item<float>(), 0.0055, 1e-8);
  EXPECT_NEAR(f[22].item<float>(), 1.7782794e-4, 1e-10);
  EXPECT_NEAR(f[31].item<float>(), 3.3338036e-6, 1e-12);
  EXPECT_NEAR(f[5].item<float>(), std::pow(1e4, -10.0 / 64), 1e-7);  // below `low`: unchanged
  EXPECT_NEAR(yarn_mscale(40, 1), 1.3688879, 1e-7);
  EXPECT_NEAR(rotary_concentration(s), 1.3688879, 1e-7);  // mscale 1, mscale_all_dim 0
  s.yarn.mscale_all_dim = 1;
  EXPECT_DOUBLE_EQ(rotary_concentration(s), 1.0);
  // DeepSeek-V3's softmax scale: mscale(40, 1)^2 / sqrt(128 + 64).
  ModelConfig m = variant_config({"--multi-latent-attention", "--qk-head-dim", "128", "--qk-pos-emb-head-dim", "64",
                                  "--rotary-scaling-factor", "40", "--mscale", "1", "--mscale-all-dim", "1"});
  EXPECT_NEAR(mla_softmax_scale(m), 0.13523378, 1e-8);
}

// Position 1 with one frequency per pair: the layouts pair different channels.
TEST(Rotary, LayoutsRotateTheirChannelPairs) {
  RotarySpec s;
  s.dim = 4;
  s.base = 100;  // inv_freq = [1, 0.1]
  auto x = torch::arange(1, 5, torch::kFloat32).view({1, 1, 1, 4}).repeat({2, 1, 1, 1});  // positions 0 and 1
  const double c0 = std::cos(1.0), s0 = std::sin(1.0), c1 = std::cos(0.1), s1 = std::sin(0.1);
  auto half = RotaryEmbedding(s).apply(x)[1].flatten();
  // Rotate-half: (x0, x2) by 1 rad, (x1, x3) by 0.1 rad.
  EXPECT_NEAR(half[0].item<float>(), 1 * c0 - 3 * s0, 1e-6);
  EXPECT_NEAR(half[2].item<float>(), 3 * c0 + 1 * s0, 1e-6);
  EXPECT_NEAR(half[1].item<float>(), 2 * c1 - 4 * s1, 1e-6);
  s.layout = RotaryLayout::Interleaved;  // (x0, x1) by 1 rad, (x2, x3) by 0.1 rad
  auto inter = RotaryEmbedding(s).apply(x)[1].flatten();
  EXPECT_NEAR(inter[0].item<float>(), 1 * c0 - 2 * s0, 1e-6);
  EXPECT_NEAR(inter[1].item<float>(), 2 * c0 + 1 * s0, 1e-6);
  EXPECT_NEAR(inter[2].item<float>(), 3 * c1 - 4 * s1, 1e-6);
  EXPECT_NEAR(inter[3].item<float>(), 4 * c1 + 3 * s1, 1e-6);
  s.layout = RotaryLayout::MlaDeinterleave;  // [x0, x2, x1, x3], then rotate-half
  auto mla = RotaryEmbedding(s).apply(x)[1].flatten();
  EXPECT_NEAR(mla[0].item<float>(), 1 * c0 - 2 * s0, 1e-6);
  EXPECT_NEAR(mla[2].item<float>(), 2 * c0 + 1 * s0, 1e-6);
  EXPECT_NEAR(mla[1].item<float>(), 3 * c1 - 4 * s1, 1e-6);
  // Position 0 is not rotated; MLA's output stays de-interleaved, as Megatron's.
  auto at0 = RotaryEmbedding(s).apply(x)[0].flatten();
  EXPECT_TRUE(torch::equal(at0, torch::tensor({1.0f, 3.0f, 2.0f, 4.0f})));
}

TEST(ModelVariants, SquaredReluMlp) {
  ModelConfig m = variant_config({"--squared-relu", "--disable-bias-linear"});
  GptModel model(m);
  auto& mlp = model->named_modules()["decoder.layers.0.mlp"];
  auto* impl = dynamic_cast<MlpImpl*>(mlp.get());
  ASSERT_NE(impl, nullptr);
  auto x = torch::randn({3, 2, m.hidden_size});
  auto h = F::linear(F::layer_norm(x, F::LayerNormFuncOptions({m.hidden_size}).weight(impl->linear_fc1->layer_norm_weight)
                                           .bias(impl->linear_fc1->layer_norm_bias).eps(m.norm_epsilon)),
                     impl->linear_fc1->weight);
  auto expected = F::linear(torch::pow(torch::relu(h), 2), impl->linear_fc2->weight);
  EXPECT_TRUE(torch::allclose(impl->forward(x), expected, 1e-5, 1e-6));
}

// MLA forward written out from its weights: q = norm(x Wqd^T) Wqu^T, c = x Wkvd^T, kv =
// norm(c_kv) Wkvu^T, MLA rope on the rotary parts, causal softmax with MLA's scale, output proj.
TEST(ModelVariants, MultiLatentAttentionMatchesItsFormula) {
  ModelConfig m = variant_config({"--multi-latent-attention", "--q-lora-rank", "12", "--kv-lora-rank", "10",
                                  "--qk-head-dim", "6", "--qk-pos-emb-head-dim", "4", "--v-head-dim", "5", "--qk-layernorm",
                                  "--normalization", "RMSNorm", "--rotary-scaling-factor", "4", "--mscale", "0.7",
                                  "--mscale-all-dim", "0.5", "--disable-bias-linear"});
  GptModel model(m);
  auto params = model->named_parameters();
  auto p = [&](const std::string& name) { return params["decoder.layers.0.self_attention." + name]; };
  auto* attention = dynamic_cast<MlaSelfAttentionImpl*>(model->named_modules()["decoder.layers.0.self_attention"].get());
  ASSERT_NE(attention, nullptr);
  const int64_t s = 5, b = 2, n = m.num_attention_heads, dn = 6, dr = 4, dv = 5;
  auto x = torch::randn({s, b, m.hidden_size});
  auto rms = [&](const torch::Tensor& t, const torch::Tensor& w) {
    return t * torch::rsqrt(t.pow(2).mean(-1, true) + m.norm_epsilon) * w;
  };
  auto q = F::linear(rms(F::linear(x, p("linear_q_down_proj.weight")), p("linear_q_up_proj.layer_norm_weight")),
                     p("linear_q_up_proj.weight")).view({s, b, n, dn + dr});
  auto c = F::linear(x, p("linear_kv_down_proj.weight"));
  auto kv = F::linear(rms(c.narrow(-1, 0, 10), p("linear_kv_up_proj.layer_norm_weight")), p("linear_kv_up_proj.weight"))
                .view({s, b, n, dn + dv});
  RotaryEmbedding rope(mla_rotary(m));
  auto q_pe = rope.apply(q.narrow(-1, dn, dr));
  auto k_pe = rope.apply(c.narrow(-1, 10, dr).unsqueeze(2)).expand({s, b, n, dr});
  auto query = torch::cat({q.narrow(-1, 0, dn), q_pe}, -1).permute({1, 2, 0, 3});
  auto key = torch::cat({kv.narrow(-1, 0, dn), k_pe}, -1).permute({1, 2, 0, 3});
  auto value = kv.narrow(-1, dn, dv).permute({1, 2, 0, 3});
  auto scores = torch::matmul(query, key.transpose(-1, -2)) * mla_softmax_scale(m);
  scores = scores.masked_fill(torch::ones({s, s}).triu(1).to(torch::kBool), -INFINITY);
  auto out = torch::matmul(torch::softmax(scores, -1), value).permute({2, 0, 1, 3}).reshape({s, b, n * dv});
  auto expected = F::linear(out, p("linear_proj.weight"));
  model->eval();
  EXPECT_TRUE(torch::allclose(attention->forward(x, {}), expected, 1e-5, 1e-6));
  // YaRN with mscale 0.7 / mscale_all_dim 0.5 scales cos and sin by their ratio, not by 1.
  EXPECT_NE(rotary_concentration(mla_rotary(m)), 1.0);
}

// Gated attention written out from its weights, with two query groups of two heads: per group the
// QKV projection holds [q (2 heads), gate (2 heads), k, v] (Megatron's layout); each head attends
// with its group's key and value, and its output is scaled by sigmoid(gate) before the projection.
TEST(GatedAttention, MatchesTheFormulaWithGroupedQueries) {
  ModelConfig m = variant_config({"--attention-output-gate", "--group-query-attention", "--num-query-groups", "2"});
  GptModel model(m);
  auto params = model->named_parameters();
  auto p = [&](const std::string& name) { return params["decoder.layers.0.self_attention." + name]; };
  auto* attention = dynamic_cast<SelfAttentionImpl*>(model->named_modules()["decoder.layers.0.self_attention"].get());
  ASSERT_NE(attention, nullptr);
  const int64_t s = 5, b = 2, n = m.num_attention_heads, g = 2, per = n / g, d = m.kv_channels;
  ASSERT_EQ(p("linear_qkv.weight").size(0), (2 * n + 2 * g) * d);
  auto x = torch::randn({s, b, m.hidden_size});
  // The gate must matter: random gate rows and biases (initialised like the rest, but be sure).
  {
    torch::NoGradGuard no_grad;
    p("linear_qkv.bias").normal_(0, 0.5);
  }
  auto normed = F::layer_norm(x, F::LayerNormFuncOptions({m.hidden_size})
                                     .weight(p("linear_qkv.layer_norm_weight"))
                                     .bias(p("linear_qkv.layer_norm_bias"))
                                     .eps(m.norm_epsilon));
  auto qkv = F::linear(normed, p("linear_qkv.weight"), p("linear_qkv.bias")).view({s, b, g, 2 * per + 2, d});
  auto q = qkv.narrow(3, 0, per).reshape({s, b, n, d});
  auto gate = qkv.narrow(3, per, per).reshape({s, b, n * d});
  auto k = qkv.select(3, 2 * per).repeat_interleave(per, 2);  // head h reads group h / per
  auto v = qkv.select(3, 2 * per + 1).repeat_interleave(per, 2);
  auto scores = torch::matmul(q.permute({1, 2, 0, 3}), k.permute({1, 2, 3, 0})) / std::sqrt(double(d));
  scores = scores.masked_fill(torch::ones({s, s}).triu(1).to(torch::kBool), -INFINITY);
  auto out = torch::matmul(torch::softmax(scores, -1), v.permute({1, 2, 0, 3})).permute({2, 0, 1, 3}).reshape({s, b, n * d});
  auto expected = F::linear(out * torch::sigmoid(gate), p("linear_proj.weight"), p("linear_proj.bias"));
  model->eval();
  EXPECT_TRUE(torch::allclose(attention->forward(x, {}), expected, 1e-5, 1e-6));
  // The gate is not a no-op: without it the output differs.
  auto ungated = F::linear(out, p("linear_proj.weight"), p("linear_proj.bias"));
  EXPECT_FALSE(torch::allclose(ungated, expected, 1e-3, 1e-4));
}

// The MTP objective's value is the main loss; its gradient adds (lambda / D) x each depth's mean
// loss on labels rolled k more positions, the last k positions masked.
TEST(ModelVariants, MultiTokenPredictionObjective) {
  ModelConfig m = variant_config({"--mtp-num-layers", "2", "--mtp-loss-scaling-factor", "0.3", "--position-embedding-type",
                                  "rope", "--untie-embeddings-and-output-weights"});
  GptModel model(m);
  model->train();
  torch::manual_seed(3);
  const int64_t b = 2, s = m.seq_length;
  auto tokens = torch::randint(0, m.vocab_size, {b, s});
  auto labels = torch::randint(0, m.vocab_size, {b, s});
  auto mask = (torch::rand({b, s}) > 0.2).to(torch::kFloat32);
  auto objective = model->forward_stage(tokens, labels, mask, {}, {}, tokens);
  // By hand: the decoder, its final norm, the output layer; then each MTP depth.
  auto ce = [&](const torch::Tensor& h, const torch::Tensor& lab) {  // [s, b]
    // Over the padded vocabulary, as Megatron (the padded logits are not masked).
    auto logits = F::linear(h, model->named_parameters()["output_layer.weight"]);
    return F::cross_entropy(logits.reshape({-1, m.padded_vocab_size}), lab.t().reshape({-1}),
                            F::CrossEntropyFuncOptions().reduction(torch::kNone)).view({s, b});
  };
  model->eval();  // the same modules without the MTP training term
  auto embedded = [&](const torch::Tensor& ids) {
    return F::embedding(ids.t(), model->named_parameters()["embedding.word_embeddings.weight"]);
  };
  auto h = embedded(tokens);
  for (const auto& item : model->named_children())
    if (item.key() == "decoder")
      for (const auto& layer : item.value()->named_children()["layers"]->children())
        h = std::dynamic_pointer_cast<TransformerLayerImpl>(layer)->forward(h);
  h = std::dynamic_pointer_cast<TELayerNormImpl>(model->named_modules()["decoder.final_layernorm"])->forward(h);
  auto main = (ce(h, labels) * mask.t()).sum() / mask.sum();
  auto ids = tokens, lab = labels, msk = mask;
  auto extra = torch::zeros({});
  for (int k = 0; k < 2; ++k) {
    ids = roll_left(ids);
    lab = roll_left(lab);
    msk = roll_left(msk);
    auto layer = std::dynamic_pointer_cast<MtpLayerImpl>(model->named_modules()["mtp.layers." + std::to_string(k)]);
    h = layer->forward(embedded(ids), h, {});
    extra = extra + 0.3 / 2 * (ce(h, lab) * msk.t()).sum() / msk.sum();
  }
  EXPECT_NEAR(objective.item<double>(), main.item<double>(), 1e-6);
  auto weights = model->named_parameters()["mtp.layers.1.eh_proj.weight"];
  auto expected = torch::autograd::grad({main + extra}, {weights})[0];
  auto actual = torch::autograd::grad({objective}, {weights})[0];
  EXPECT_TRUE(torch::allclose(actual, expected, 1e-5, 1e-7));
  EXPECT_GT(actual.abs().max().item<double>(), 0.0);
  int64_t micro = 0;
  auto logged = model->take_mtp_losses(&micro);
  EXPECT_EQ(micro, 1);
  ASSERT_EQ(logged.size(), 2u);
}

TEST(ModelVariants, ParameterCountsMatchTheModels) {
  for (auto flags : std::vector<std::vector<std::string>>{
           {"--multi-latent-attention", "--q-lora-rank", "12", "--kv-lora-rank", "10", "--qk-head-dim", "6",
            "--qk-pos-emb-head-dim", "4", "--v-head-dim", "5", "--qk-layernorm"},
           {"--multi-latent-attention", "--kv-lora-rank", "10", "--qk-head-dim", "6", "--qk-pos-emb-head-dim", "4",
            "--v-head-dim", "5", "--normalization", "RMSNorm"},
           {"--mtp-num-layers", "2", "--position-embedding-type", "rope", "--squared-relu", "--disable-bias-linear"},
           {"--attention-output-gate", "--group-query-attention", "--num-query-groups", "2"}}) {
    auto args = tiny_args({"--attention-dropout", "0", "--hidden-dropout", "0"});
    args.insert(args.end(), flags.begin(), flags.end());
    ModelConfig m = build(args).model;
    GptModel model(m);
    int64_t n = 0;
    for (const auto& p : model->parameters()) n += p.numel();
    EXPECT_EQ(count_parameters(m).total, n) << flags.front();
  }
}

}  // namespace fp8tron
