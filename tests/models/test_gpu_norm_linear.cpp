// GPU tests of the norm run as the prologue of a GEMM's op (models/norm/residual_norm.h, NormPrologue):
// the backward's rewrite of the norm's output against the forward's, and the two ops built on it
// (models/linear/norm_linear.h, fused_norm_gelu_mlp in models/mlp/fused_gelu_mlp.h) against the separate norm
// and linear they replace, which keep the normed input. Both sides run the same kernels, so every
// output and gradient must be equal bit for bit (label gpu; skipped without a CUDA device).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "fp8/fp8_linear.h"
#include "fp8/norm_backward.h"
#include "models/mlp/fused_gelu_mlp.h"
#include "models/linear/fused_linear.h"
#include "models/linear/norm_linear.h"
#include "models/norm/residual_norm.h"

namespace fp8tron {
namespace {

#define REQUIRE_GPU() \
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device"

const auto kCuda = torch::TensorOptions().device(torch::kCUDA);

NormOptions norm_options(Normalization kind, int64_t hidden, bool zero_centered = false) {
  NormOptions o;
  o.size = hidden;
  o.kind = kind;
  o.epsilon = 1e-5;
  o.zero_centered_gamma = zero_centered;
  return o;
}

// gamma near 1 (stored as gamma - 1 when zero-centred) and a small beta (LayerNorm, with_beta).
NormPrologue norm_params(const NormOptions& o, torch::Dtype dtype, bool with_beta) {
  NormPrologue n;
  n.options = o;
  n.weight = (torch::randn({o.size}, kCuda) * 0.1 + (o.zero_centered_gamma ? 0.0 : 1.0)).to(dtype);
  if (o.kind == Normalization::LayerNorm && with_beta) n.bias = (torch::randn({o.size}, kCuda) * 0.1).to(dtype);
  return n;
}

// Rows with a non-zero mean each, so that LayerNorm's centring matters.
torch::Tensor rows(int64_t count, int64_t hidden, torch::Dtype dtype) {
  return (torch::randn({count, hidden}, kCuda) * 2 + torch::randn({count, 1}, kCuda)).to(dtype);
}

TEST(GpuNormPrologue, BackwardRewritesTheForwardOutputBitwise) {
  REQUIRE_GPU();
  torch::NoGradGuard no_grad;
  for (auto dtype : {torch::kFloat32, torch::kBFloat16, torch::kFloat16}) {
    for (auto kind : {Normalization::LayerNorm, Normalization::RMSNorm}) {
      // 16-byte packs (multiples of 8), single elements (1001), one to several packs per thread.
      for (int64_t hidden : {64, 768, 1001, 2048, 8192}) {
        for (bool zero_centered : {false, true}) {
          for (bool with_beta : {true, false}) {
            if (kind == Normalization::RMSNorm && with_beta) continue;
            const std::string where = std::string(c10::toString(dtype)) + (kind == Normalization::RMSNorm ? " RMSNorm" : " LayerNorm") +
                                      " hidden " + std::to_string(hidden) + (zero_centered ? " zero-centred" : "") +
                                      (with_beta ? " with beta" : "");
            torch::manual_seed(hidden);
            const auto norm = norm_params(norm_options(kind, hidden, zero_centered), dtype, with_beta);
            const auto residual = rows(67, hidden, dtype), branch = rows(67, hidden, dtype);
            const auto f = norm_prologue_forward(residual, branch, norm);
            const auto d_normed = rows(67, hidden, dtype), d_sum = rows(67, hidden, dtype);
            NormGradRequest params;  // gamma's and (where there is one) beta's gradients
            params.gamma = params.beta = true;
            const auto plain = norm_prologue_backward(norm, f.saved, d_normed, d_sum, params, false);
            const auto rewriting = norm_prologue_backward(norm, f.saved, d_normed, d_sum, params, true);
            ASSERT_TRUE(rewriting.normed.defined()) << where;
            EXPECT_FALSE(plain.normed.defined()) << where;
            EXPECT_TRUE(torch::equal(rewriting.normed, f.normed)) << where << ": the rewritten output differs";
            // Writing the output again changes none of the gradients.
            EXPECT_TRUE(torch::equal(rewriting.d_in, plain.d_in)) << where;
            EXPECT_TRUE(torch::equal(rewriting.d_weight, plain.d_weight)) << where;
            EXPECT_EQ(rewriting.d_bias.defined(), with_beta && kind == Normalization::LayerNorm) << where;
            if (rewriting.d_bias.defined()) EXPECT_TRUE(torch::equal(rewriting.d_bias, plain.d_bias)) << where;
            // The norm of residual alone, without parameter gradients.
            const auto alone = norm_prologue_forward(residual, torch::Tensor(), norm);
            const auto b = norm_prologue_backward(norm, alone.saved, d_normed, torch::Tensor(), {}, true);
            EXPECT_TRUE(torch::equal(b.normed, alone.normed)) << where << " (no branch)";
            EXPECT_FALSE(b.d_weight.defined()) << where;
          }
        }
      }
    }
  }
}

// The FP8 norm-linear's backward through our kernel (fp8/norm_backward.h) against torch's kernels,
// from the same saved statistics: the same gradients within bf16 rounding (different sums).
TEST(GpuNormPrologue, Fp8NormBackwardMatchesTorchs) {
  REQUIRE_GPU();
  torch::NoGradGuard no_grad;
  for (auto kind : {Normalization::LayerNorm, Normalization::RMSNorm}) {
    for (bool with_beta : {true, false}) {
      if (kind == Normalization::RMSNorm && with_beta) continue;
      for (int64_t hidden : {768, 2048}) {
        torch::manual_seed(hidden);
        const auto norm = norm_params(norm_options(kind, hidden), torch::kBFloat16, with_beta);
        const auto x = rows(300, hidden, torch::kBFloat16);
        const auto f = norm_prologue_forward(x, torch::Tensor(), norm);  // the statistics, fp32 [rows]
        const fp8::NormBackwardInputs in{rows(300, hidden, torch::kBFloat16), x, f.saved.mean, f.saved.rstd, norm.weight,
                                         norm.bias, true, with_beta};
        const auto ours = fp8_norm_backward(in), theirs = fp8::torch_norm_backward(in);
        const std::string where = std::string(kind == Normalization::RMSNorm ? "RMSNorm" : "LayerNorm") + " hidden " +
                                  std::to_string(hidden) + (with_beta ? " with beta" : "");
        auto close = [&](const torch::Tensor& a, const torch::Tensor& b, const char* what) {
          ASSERT_TRUE(a.defined() && b.defined()) << where << ": " << what;
          const auto af = a.to(torch::kFloat32), bf = b.to(torch::kFloat32);
          const double scale = bf.abs().max().item<double>();
          EXPECT_LT((af - bf).abs().max().item<double>(), 2e-2 * scale) << where << ": " << what;
        };
        close(ours.dx, theirs.dx, "dx");
        close(ours.dgamma, theirs.dgamma, "dgamma");
        if (with_beta) close(ours.dbeta, theirs.dbeta, "dbeta");
        else EXPECT_FALSE(ours.dbeta.defined()) << where;
        // Given to an engine, the FP8 path's entry point runs ours; an engine without it, torch's.
        fp8::Fp8Engine given(fp8::Fp8EngineOptions{}, torch::Device(torch::kCUDA, 0));
        fp8::Fp8Engine plain(fp8::Fp8EngineOptions{}, torch::Device(torch::kCUDA, 0));
        given.use_backward_kernels(&fp8_norm_backward, nullptr);
        EXPECT_TRUE(torch::equal(given.norm_backward(in).dx, ours.dx)) << where;
        EXPECT_TRUE(torch::equal(plain.norm_backward(in).dx, theirs.dx)) << where;
      }
    }
  }
}

// ---- the ops against the separate norm and linear -----------------------------------------------

// bf16 leaves; the linears' weights and biases get fp32 main gradients (as the optimizer's flat
// buffer gives them) holding an earlier accumulation, so that the GEMMs add into them.
torch::Tensor leaf(const torch::Tensor& v) { return v.clone().requires_grad_(true); }
torch::Tensor main_grad_leaf(const torch::Tensor& v) {
  auto p = leaf(v);
  p.mutable_grad() = torch::randn(v.sizes(), kCuda) * 0.01;
  return p;
}

struct Case {
  std::string name;
  Normalization kind;
  bool biases;  // beta (LayerNorm) and the linears' biases
  bool branch;  // a pending residual add, or the norm of residual alone
};
std::vector<Case> cases() {
  return {{"GPT: LayerNorm, biases", Normalization::LayerNorm, true, true},
          {"LLaMA: RMSNorm, no biases", Normalization::RMSNorm, false, true},
          {"LayerNorm without beta, no pending add", Normalization::LayerNorm, false, false}};
}

// One side's leaves: the stream, the norm's parameters and the linears'. With biases the pending
// branch has one too (the last sub-layer's output projection's, left to the norm), whose gradient
// the norm's pass adds into its main gradient, as it does gamma's and beta's.
struct Leaves {
  torch::Tensor residual, branch, branch_bias, gamma, beta;
  std::vector<torch::Tensor> linear;  // w1, b1 (may be undefined), w2, b2
};
Leaves leaves_of(const Leaves& values) {
  Leaves l;
  l.residual = leaf(values.residual);
  if (values.branch.defined()) l.branch = leaf(values.branch);
  if (values.branch_bias.defined()) l.branch_bias = main_grad_leaf(values.branch_bias);
  l.gamma = main_grad_leaf(values.gamma);
  if (values.beta.defined()) l.beta = main_grad_leaf(values.beta);
  for (const auto& v : values.linear) l.linear.push_back(v.defined() ? main_grad_leaf(v) : torch::Tensor());
  return l;
}
std::vector<torch::Tensor> grads_of(const Leaves& l) {
  std::vector<torch::Tensor> g = {l.residual.grad(), l.branch.defined() ? l.branch.grad() : torch::Tensor(), l.gamma.grad(),
                                  l.beta.defined() ? l.beta.grad() : torch::Tensor()};
  for (const auto& p : l.linear) g.push_back(p.defined() ? p.grad() : torch::Tensor());
  g.push_back(l.branch_bias.defined() ? l.branch_bias.grad() : torch::Tensor());
  return g;
}

// Runs `op` (stream, norm, linear parameters -> {sum, y}) on fresh leaves, back-propagates
// sum * c_sum + y * c_y, and returns the outputs followed by every leaf's gradient.
template <class Op>
std::vector<torch::Tensor> run(const Leaves& values, const NormOptions& o, const torch::Tensor& c_sum,
                               const torch::Tensor& c_y, Op op) {
  torch::manual_seed(5);  // the same earlier accumulations on both sides
  const Leaves l = leaves_of(values);
  const ResidualStream in{l.residual, l.branch, l.branch_bias};
  const NormPrologue norm{o, l.gamma, l.beta};
  const ResidualOutput r = op(in, norm, l.linear);
  auto loss = (r.out.to(torch::kFloat32) * c_y).sum();
  if (l.branch.defined()) loss = loss + (r.sum.to(torch::kFloat32) * c_sum).sum();
  loss.backward();
  std::vector<torch::Tensor> out = {r.sum.detach(), r.out.detach()};
  for (const auto& g : grads_of(l)) out.push_back(g);
  return out;
}

void expect_bitwise(const std::vector<torch::Tensor>& fused, const std::vector<torch::Tensor>& separate, const std::string& where) {
  static const char* names[] = {"sum", "output", "d_residual", "d_branch", "d_gamma", "d_beta", "w1", "b1", "w2", "b2",
                                "branch bias"};
  ASSERT_EQ(fused.size(), separate.size());
  for (size_t i = 0; i < fused.size(); ++i) {
    ASSERT_EQ(fused[i].defined(), separate[i].defined()) << where << ": " << names[i];
    if (fused[i].defined()) EXPECT_TRUE(torch::equal(fused[i], separate[i])) << where << ": " << names[i] << " differs";
  }
}

Leaves values_for(const Case& c, int64_t tokens, int64_t hidden, int64_t ffn, int64_t out) {
  torch::manual_seed(23);
  Leaves v;
  v.residual = rows(tokens, hidden, torch::kBFloat16).view({tokens / 2, 2, hidden});
  if (c.branch) v.branch = rows(tokens, hidden, torch::kBFloat16).view({tokens / 2, 2, hidden});
  if (c.branch && c.biases) v.branch_bias = (torch::randn({hidden}, kCuda) * 0.1).to(torch::kBFloat16);
  const auto n = norm_params(norm_options(c.kind, hidden), torch::kBFloat16, c.biases);
  v.gamma = n.weight;
  v.beta = n.bias;
  auto param = [&](std::vector<int64_t> shape, double std) { return (torch::randn(shape, kCuda) * std).to(torch::kBFloat16); };
  v.linear = {param({ffn, hidden}, 0.05), c.biases ? param({ffn}, 0.1) : torch::Tensor(), param({out, ffn}, 0.05),
              c.biases ? param({out}, 0.1) : torch::Tensor()};
  return v;
}

TEST(GpuNormLinear, IsTheSeparateNormAndLinearBitwise) {
  REQUIRE_GPU();
  const int64_t tokens = 96, hidden = 256, out = 384;
  for (const auto& c : cases()) {
    const auto v = values_for(c, tokens, hidden, out, 8);
    const auto o = norm_options(c.kind, hidden);
    const auto c_sum = torch::randn({tokens / 2, 2, hidden}, kCuda), c_y = torch::randn({tokens / 2, 2, out}, kCuda);
    const auto fused = run(v, o, c_sum, c_y, [&](const ResidualStream& in, const NormPrologue& norm, const std::vector<torch::Tensor>& p) {
      const auto main_grads = make_main_grads();
      EXPECT_TRUE(norm_linear_applies(in, norm, p[0], *main_grads)) << c.name;
      return norm_linear(in, norm, p[0], p[1], main_grads);
    });
    const auto separate = run(v, o, c_sum, c_y, [](const ResidualStream& in, const NormPrologue& norm, const std::vector<torch::Tensor>& p) {
      const auto main_grads = make_main_grads();
      const auto r = residual_add_norm(in.residual, in.branch, norm.options, norm.weight, norm.bias, in.branch_bias,
                                       main_grads);
      return ResidualOutput{r.sum, linear_with_grad_accumulation_fusion(r.normed, p[0], p[1], main_grads)};
    });
    expect_bitwise(fused, separate, c.name);
  }
}

TEST(GpuNormLinear, NormGeluMlpIsTheSeparateNormAndMlpBitwise) {
  REQUIRE_GPU();
  const int64_t tokens = 96, hidden = 256, ffn = 1024;
  for (const auto& c : cases()) {
    const auto v = values_for(c, tokens, hidden, ffn, hidden);
    const auto o = norm_options(c.kind, hidden);
    const auto c_sum = torch::randn({tokens / 2, 2, hidden}, kCuda), c_y = torch::randn({tokens / 2, 2, hidden}, kCuda);
    const auto fused = run(v, o, c_sum, c_y, [](const ResidualStream& in, const NormPrologue& norm, const std::vector<torch::Tensor>& p) {
      return fused_norm_gelu_mlp(in, norm, GeluMlpParams{p[0], p[1], p[2], p[3], make_main_grads()});
    });
    const auto separate = run(v, o, c_sum, c_y, [](const ResidualStream& in, const NormPrologue& norm, const std::vector<torch::Tensor>& p) {
      const auto main_grads = make_main_grads();
      const auto r = residual_add_norm(in.residual, in.branch, norm.options, norm.weight, norm.bias, in.branch_bias,
                                       main_grads);
      return ResidualOutput{r.sum, fused_gelu_mlp(r.normed, GeluMlpParams{p[0], p[1], p[2], p[3], main_grads})};
    });
    expect_bitwise(fused, separate, c.name);
  }
}

}  // namespace
}  // namespace fp8tron
