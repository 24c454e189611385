// The fused residual add + norm (models/norm/residual_norm.h) on the CPU, where it is the unfused chain:
// the op against the chain written out (values and every gradient, LayerNorm and RMSNorm, with and
// without a zero-centred gamma), and whole models whose layers hand their last add on to the next
// norm, against the same models run the way the layers ran before (tests/models/unfused_model.h): the
// same losses and gradients bit for bit. The GPU kernels are checked in
// tests/models/test_gpu_residual_norm.cpp.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <map>
#include <string>
#include <vector>

#include "models/norm/residual_norm.h"
#include "residual_norm_harness.h"
#include "tests/test_helpers.h"
#include "unfused_model.h"

namespace fp8tron {
namespace {
using namespace fp8tron::testing;

void expect_equal(const torch::Tensor& a, const torch::Tensor& b, const char* what) {
  ASSERT_EQ(a.defined(), b.defined()) << what;
  if (a.defined()) EXPECT_TRUE(torch::equal(a, b)) << what;
}

TEST(ResidualNorm, CpuIsTheUnfusedChainBitwise) {
  const int64_t hidden = 24;
  for (const auto kind : {Normalization::LayerNorm, Normalization::RMSNorm}) {
    for (const bool zero_centered : {false, true}) {
      for (const bool with_branch : {true, false}) {
        for (const auto dtype : {torch::kFloat32, torch::kBFloat16}) {
          SCOPED_TRACE(std::string(kind == Normalization::RMSNorm ? "RMSNorm" : "LayerNorm") +
                       (zero_centered ? " zero-centred" : "") + (with_branch ? "" : " no branch") + " " +
                       c10::toString(dtype));
          const NormOptions o{hidden, kind, 1e-5, zero_centered};
          torch::manual_seed(11);
          const auto residual = torch::randn({5, 3, hidden}).to(dtype);
          const auto branch = with_branch ? torch::randn({5, 3, hidden}).to(dtype) : torch::Tensor();
          const auto weight = (torch::randn({hidden}) * 0.1 + (zero_centered ? 0.0 : 1.0)).to(dtype);
          const auto bias = kind == Normalization::LayerNorm ? (torch::randn({hidden}) * 0.1).to(dtype) : torch::Tensor();
          const auto c_sum = torch::randn({5, 3, hidden}).to(dtype), c_normed = torch::randn({5, 3, hidden}).to(dtype);

          auto fused = [&](const torch::Tensor& r, const torch::Tensor& b, const torch::Tensor& w, const torch::Tensor& bb) {
            return residual_add_norm(r, b, o, w, bb, {}, nullptr);
          };
          // The chain as the layers wrote it before the fusion.
          auto chain = [&](const torch::Tensor& r, const torch::Tensor& b, const torch::Tensor& w, const torch::Tensor& bb) {
            const auto sum = b.defined() ? r + b : r;
            const auto gamma = zero_centered ? w + 1 : w;
            const auto normed = kind == Normalization::RMSNorm ? at::rms_norm(sum, {hidden}, gamma, 1e-5)
                                                               : at::layer_norm(sum, {hidden}, gamma, bb, 1e-5);
            return ResidualNormOutput{sum, normed};
          };
          for (const bool both : {true, false}) {  // both outputs used, or only the normed one
            const auto cs = both ? c_sum : torch::Tensor();
            const auto a = run_residual_norm(fused, residual, branch, weight, bias, cs, c_normed);
            const auto b = run_residual_norm(chain, residual, branch, weight, bias, cs, c_normed);
            expect_equal(a.sum, b.sum, "sum");
            expect_equal(a.normed, b.normed, "normed");
            expect_equal(a.d_residual, b.d_residual, "residual's gradient");
            expect_equal(a.d_branch, b.d_branch, "branch's gradient");
            expect_equal(a.d_weight, b.d_weight, "weight's gradient");
            expect_equal(a.d_bias, b.d_bias, "bias's gradient");
          }
        }
      }
    }
  }
}

TEST(ResidualNorm, WithoutABranchTheSumIsTheResidualItself) {
  const auto x = torch::randn({4, 16});
  const auto out = residual_add_norm(x, {}, NormOptions{16, Normalization::RMSNorm, 1e-6, false}, torch::ones({16}), {}, {},
                                     nullptr);
  EXPECT_TRUE(out.sum.is_same(x));
  EXPECT_TRUE(torch::equal(out.normed, at::rms_norm(x, {16}, torch::ones({16}), 1e-6)));
  EXPECT_TRUE((ResidualStream{x, {}}.sum(nullptr).is_same(x)));
}

// Logits and every parameter's gradient of a whole model (the layers threading their pending adds
// into the next norm) against the same model run with each add in front of its norm.
void expect_model_matches_unfused(std::initializer_list<std::string> extra, const std::string& what) {
  SCOPED_TRACE(what);
  auto args = tiny_args({"--num-layers", "3"});
  args.insert(args.end(), extra.begin(), extra.end());
  const ModelConfig m = build(args).model;
  GptModel model(m);
  model->train();
  torch::manual_seed(5);
  const auto tokens = torch::randint(0, m.vocab_size, {2, m.seq_length}, torch::kLong);
  const auto upstream = torch::randn({2, m.seq_length, m.padded_vocab_size});

  const auto fused = logits_and_grads(*model, upstream, [&] { return model->forward(tokens); });
  const auto unfused = logits_and_grads(*model, upstream, [&] { return unfused_logits(*model, tokens); });
  EXPECT_TRUE(torch::equal(fused.first, unfused.first)) << "logits";
  ASSERT_EQ(fused.second.size(), unfused.second.size());
  ASSERT_FALSE(fused.second.empty());
  for (const auto& [name, g] : fused.second) EXPECT_TRUE(torch::equal(g, unfused.second.at(name))) << name;
}

TEST(ResidualNorm, ModelsGiveTheUnfusedLayersLogitsAndGradientsBitwise) {
  expect_model_matches_unfused({"--hidden-dropout", "0.2", "--attention-dropout", "0.1"},
                               "GPT: LayerNorm, learned positions, tied output, both dropouts");
  expect_model_matches_unfused({"--hidden-dropout", "0", "--attention-dropout", "0", "--normalization", "RMSNorm",
                                "--apply-layernorm-1p", "--swiglu", "--position-embedding-type", "rope", "--qk-layernorm",
                                "--untie-embeddings-and-output-weights", "--disable-bias-linear"},
                               "LLaMA-style: RMSNorm with zero-centred gamma, SwiGLU, RoPE, QK norm, untied");
  expect_model_matches_unfused({"--hidden-dropout", "0.1", "--attention-dropout", "0", "--apply-layernorm-1p",
                                "--num-experts", "4", "--moe-ffn-hidden-size", "32", "--moe-layer-freq", "([0]+[1]+[1])"},
                               "MoE layers: the pre-MLP norm takes the attention's add");
  expect_model_matches_unfused({"--hidden-dropout", "0", "--attention-dropout", "0", "--multi-latent-attention",
                                "--q-lora-rank", "12", "--kv-lora-rank", "10", "--qk-head-dim", "6",
                                "--qk-pos-emb-head-dim", "4", "--v-head-dim", "8", "--qk-layernorm",
                                "--position-embedding-type", "rope", "--normalization", "RMSNorm"},
                               "MLA: its input norm takes the previous layer's add");
}

}  // namespace
}  // namespace fp8tron
