// The dense MLP's fused GeLU path (models/mlp/fused_gelu_mlp.h) on the CPU, where it never runs: its
// dispatch conditions, each named, and the Mlp module running today's chain of ops bitwise with
// the fusion on or off (the GPU path is checked in tests/models/test_gpu_gelu_mlp.cpp).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <stdexcept>
#include <string>

#include "models/mlp/fused_gelu_mlp.h"
#include "models/gpt_model.h"
#include "parallel/parallel_state.h"

namespace fp8tron {
namespace {

const auto kBf16 = torch::TensorOptions().dtype(torch::kBFloat16);

// A bf16 parameter whose gradient is an fp32 main-gradient buffer.
torch::Tensor with_main_grad(torch::Tensor p) {
  p.requires_grad_(true);
  p.mutable_grad() = torch::zeros(p.sizes(), torch::kFloat32);
  return p;
}

GeluMlpParams params(int64_t in, int64_t ffn, int64_t out) {
  return {with_main_grad(torch::randn({ffn, in}, kBf16)), with_main_grad(torch::randn({ffn}, kBf16)),
          with_main_grad(torch::randn({out, ffn}, kBf16)), with_main_grad(torch::randn({out}, kBf16)), make_main_grads()};
}

// Each condition fails alone (the device is checked last, so everything before it is seen here).
TEST(FusedGeluMlp, NamesWhyItCannotRun) {
  torch::manual_seed(1);
  const auto x = torch::randn({3, 2, 16}, kBf16);
  const GeluMlpParams p = params(16, 32, 16);
  EXPECT_EQ(fused_gelu_mlp_blocker(x, p), "not on a GPU");
  GeluMlpParams fusion_off = p;  // --no-gradient-accumulation-fusion
  fusion_off.main_grads = make_main_grads(false);
  EXPECT_EQ(fused_gelu_mlp_blocker(x, fusion_off), "gradient-accumulation fusion is off");
  EXPECT_EQ(fused_gelu_mlp_blocker(x.to(torch::kFloat32), p), "the input and parameters are not all bf16");
  GeluMlpParams fp32_bias = p;
  fp32_bias.fc2_bias = p.fc2_bias.detach().to(torch::kFloat32);
  EXPECT_EQ(fused_gelu_mlp_blocker(x, fp32_bias), "the input and parameters are not all bf16");
  GeluMlpParams no_main_grad = p;
  no_main_grad.fc2_weight = p.fc2_weight.detach().clone().requires_grad_(true);
  EXPECT_EQ(fused_gelu_mlp_blocker(x, no_main_grad), "a weight has no fp32 main gradient");
  no_main_grad.fc2_weight.mutable_grad() = torch::zeros({16, 32}, kBf16);  // a bf16 gradient is no main gradient
  EXPECT_EQ(fused_gelu_mlp_blocker(x, no_main_grad), "a weight has no fp32 main gradient");
  // Biases need no main gradient (theirs then goes through autograd); without biases it applies too.
  GeluMlpParams plain_biases = p;
  plain_biases.fc1_bias = p.fc1_bias.detach().clone().requires_grad_(true);
  EXPECT_EQ(fused_gelu_mlp_blocker(x, plain_biases), "not on a GPU");
  EXPECT_EQ(fused_gelu_mlp_blocker(x, GeluMlpParams{p.fc1_weight, {}, p.fc2_weight, {}, p.main_grads}), "not on a GPU");
  EXPECT_NE(fused_gelu_mlp_blocker(x, params(16, 36, 16)).find("fc1's 36 output features (this rank's) are not a multiple of 8"),
            std::string::npos);
  EXPECT_EQ(fused_gelu_mlp_blocker(torch::randn({0, 2, 16}, kBf16), p), "no tokens");
  EXPECT_THROW(fused_gelu_mlp_blocker(torch::randn({3, 2, 8}, kBf16), p), std::logic_error);  // shapes do not chain
  try {
    fused_gelu_mlp(x, p);
    ADD_FAILURE() << "the fused MLP ran on the CPU";
  } catch (const std::logic_error& e) {
    EXPECT_NE(std::string(e.what()).find("does not apply: not on a GPU"), std::string::npos) << e.what();
  }
}

// The Mlp module on the CPU, with the fusion on (the default) and off (--no-bias-gelu-fusion):
// LayerNorm, fc1, GeLU (tanh), fc2 as separate ops, forward and input gradient bitwise.
TEST(FusedGeluMlp, CpuModuleRunsTheUnfusedChain) {
  for (const bool fusion : {true, false}) {
    SCOPED_TRACE(fusion ? "bias_gelu_fusion on" : "off");
    ModelConfig m;
    m.num_layers = 2;
    m.hidden_size = 16;
    m.ffn_hidden_size = 64;
    m.bias_gelu_fusion = fusion;
    const TensorParallelContext tp{make_self_communicator("tp", 0), 0, 1, false};
    Mlp mlp(m, "decoder.layers.0.mlp", ModuleFactory(1234, tp));
    mlp->to(torch::kBFloat16);
    {
      torch::NoGradGuard no_grad;
      for (auto& p : mlp->parameters()) {
        p.add_(torch::randn_like(p) * 0.05);
        p.mutable_grad() = torch::zeros(p.sizes(), torch::kFloat32);
      }
    }
    torch::manual_seed(2);
    const auto x = torch::randn({5, 3, 16}, kBf16), dy = torch::randn({5, 3, 16}, kBf16);
    auto xm = x.clone().requires_grad_(true), xc = x.clone().requires_grad_(true);
    auto y = mlp->forward(xm);
    ASSERT_TRUE(y.grad_fn());
    EXPECT_EQ(y.grad_fn()->name().find("FusedGeluMlp"), std::string::npos) << y.grad_fn()->name();
    const auto& fc1 = *mlp->linear_fc1;
    const auto& fc2 = *mlp->linear_fc2;
    const auto normed = at::layer_norm(xc, {16}, fc1.layer_norm_weight, fc1.layer_norm_bias, m.norm_epsilon);
    const auto chain = at::linear(at::gelu(at::linear(normed, fc1.weight, fc1.bias), "tanh"), fc2.weight, fc2.bias);
    EXPECT_TRUE(torch::equal(y, chain));
    y.backward(dy);
    chain.backward(dy);
    EXPECT_TRUE(torch::equal(xm.grad(), xc.grad()));
  }
}

}  // namespace
}  // namespace fp8tron
