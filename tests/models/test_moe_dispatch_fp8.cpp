// --moe-dispatch-fp8 on the CPU (fp8/packed_rows.h, the alltoall dispatcher's FP8 path): tokens
// quantized once on the sender give, bit for bit, the row-wise copy, scales and dequantized copy
// the experts' grouped cast gives on the receiver (every segment, padding and empty expert), for
// blockwise (1x128, a partial block too) and MXFP8; the packed row's bytes; the experts' grouped
// linear fed those codes has the forward and input gradient of the bf16 dispatch bit for bit and
// the weight gradient of its input's dequantized values; an MoE layer with the flag, in one
// process, the output and every gradient but the experts' fc1 weights of the layer without it;
// training end to end with the flag, its first loss that of the run without it.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <map>

#include "core/error.h"
#include "fp8/fp8_grouped_linear.h"
#include "fp8/packed_rows.h"
#include "fp8/recipe.h"
#include "models/moe/moe_layer.h"
#include "parallel/parallel_state.h"
#include "tests/test_helpers.h"
#include "trainer/trainer.h"

namespace fp8tron {
namespace {
using namespace fp8tron::testing;

constexpr int64_t kCols = 160;  // blockwise: one whole 1x128 block and a partial one; MXFP8: 5 blocks

std::shared_ptr<fp8::Fp8Engine> cpu_engine(fp8::RecipeKind kind) {
  fp8::Fp8EngineOptions o;
  o.recipe = fp8::make_recipe(kind, fp8::Fp8Format::kE4M3);
  o.num_layers = 4;
  return std::make_shared<fp8::Fp8Engine>(o, torch::Device(torch::kCPU));
}

std::vector<fp8::Fp8Site*> register_sites(fp8::Fp8Engine& e, size_t n, int64_t out, int64_t in) {
  std::vector<fp8::Fp8Site*> sites;
  for (size_t i = 0; i < n; ++i)
    sites.push_back(e.add_site("decoder.layers.1.mlp.experts.linear_fc1.weight" + std::to_string(i), 1, out, in).get());
  return sites;
}

// Rows of very different magnitudes (every scale differs), a zero row, and fp32 values that are
// not bf16 (the casts round them to bf16 first).
torch::Tensor tokens(int64_t rows, int64_t cols, uint64_t seed) {
  torch::manual_seed(seed);
  auto x = torch::randn({rows, cols}) * torch::pow(2.0, torch::randint(-12, 12, {rows, 1}).to(torch::kFloat32));
  if (rows > 3) x[3].zero_();
  return x;
}

const std::vector<int64_t> kSplits = {5, 0, 19, 16, 1};  // unaligned, empty, aligned

class PackedRows : public ::testing::TestWithParam<fp8::RecipeKind> {};

TEST_P(PackedRows, SenderCodesAreTheGroupedCastsCodes) {
  auto e = cpu_engine(GetParam());
  const auto sites = register_sites(*e, kSplits.size(), 64, kCols);
  int64_t rows = 0;
  for (int64_t s : kSplits) rows += s;
  const auto x = tokens(rows, kCols, 7);
  // The receiver's own cast of the bf16 dispatch's rows.
  const auto want = fp8::quantize_grouped(*e, sites, fp8::TensorRole::kInput, x, kSplits, true, false, false);
  // Each row quantized alone on the sender (here in another order: rows are independent), packed,
  // then laid out by the receiver.
  const auto order = torch::randperm(rows, torch::kInt64);
  const auto packed_shuffled = fp8::quantize_packed_rows(*e, x.index_select(0, order));
  const auto packed = torch::empty_like(packed_shuffled).index_copy_(0, order, packed_shuffled);
  const auto layout = fp8::packed_row_layout(e->recipe(), kCols);
  ASSERT_EQ(packed.sizes(), (std::vector<int64_t>{rows, layout.row_bytes()}));
  const auto values = fp8::dequantize_packed_rows(*e, packed, kCols);
  const auto got = fp8::quantize_grouped_from_packed(*e, sites, packed, values, kSplits, /*transposed=*/true);
  EXPECT_TRUE(torch::equal(got->data, want->data));
  EXPECT_TRUE(torch::equal(got->scale_inv, want->scale_inv));  // the padding's scales too
  EXPECT_TRUE(torch::equal(got->dequantized, want->dequantized));
  // The values are the dequantized copy's real rows.
  for (size_t s = 0; s < kSplits.size(); ++s) {
    if (kSplits[s] == 0) continue;
    EXPECT_TRUE(torch::equal(values.narrow(0, int64_t(want->layout.src_begin[s]), kSplits[s]),
                             want->dequantized.narrow(0, int64_t(want->layout.row_begin[s]), kSplits[s])))
        << "segment " << s;
  }
  // The transposed copy is the cast of those values (not of x: its blocks run along the tokens).
  const auto t = fp8::quantize_grouped(*e, sites, fp8::TensorRole::kInput, values, kSplits, false, true, false);
  EXPECT_TRUE(torch::equal(got->data_t, t->data_t));
  EXPECT_TRUE(torch::equal(got->scale_inv_t, t->scale_inv_t));
  EXPECT_TRUE(torch::equal(got->dequantized_t, t->dequantized_t));
  // No rows: an empty packed tensor of the row's width.
  EXPECT_EQ(fp8::quantize_packed_rows(*e, torch::zeros({0, kCols})).sizes(), (std::vector<int64_t>{0, layout.row_bytes()}));
}

// Forward and the input gradient are the bf16 dispatch's, bit for bit; the weight gradient is the
// one of the dequantized values (whose transposed copy it reads), the bias gradient the same.
TEST_P(PackedRows, GroupedLinearForwardAndInputGradientAreTheBf16Dispatchs) {
  const int64_t out = 48;
  int64_t rows = 0;
  for (int64_t s : kSplits) rows += s;
  const auto x = tokens(rows, kCols, 11);
  torch::manual_seed(3);
  std::vector<torch::Tensor> w, b;
  for (size_t i = 0; i < kSplits.size(); ++i) {
    w.push_back((torch::randn({out, kCols}) * 0.05).requires_grad_(true));
    b.push_back((torch::randn({out}) * 0.1).requires_grad_(true));
  }
  const auto dy = torch::randn({rows, out});
  struct Run {
    torch::Tensor y, dx;
    std::vector<torch::Tensor> dw, db;
  };
  auto run = [&](const torch::Tensor& input, bool packed_input) {
    auto e = cpu_engine(GetParam());
    const auto sites = register_sites(*e, kSplits.size(), out, kCols);
    for (auto& p : w) p.mutable_grad() = torch::Tensor();
    for (auto& p : b) p.mutable_grad() = torch::Tensor();
    auto xin = input.detach().clone().requires_grad_(true);
    torch::Tensor packed;
    if (packed_input) {
      packed = fp8::quantize_packed_rows(*e, input);
      xin = fp8::dequantize_packed_rows(*e, packed, kCols).detach().requires_grad_(true);
    }
    Run r;
    r.y = fp8::grouped_linear(xin, kSplits, w, b, sites, fp8::Bf16GroupedBackend::kAtenMm, fp8::Prologue::kNone, true,
                              nullptr, packed);
    r.y.backward(dy);
    r.dx = xin.grad();
    for (auto& p : w) r.dw.push_back(p.grad().clone());
    for (auto& p : b) r.db.push_back(p.grad().clone());
    return r;
  };
  const Run bf16_dispatch = run(x, false), fp8_dispatch = run(x, true);
  EXPECT_TRUE(torch::equal(fp8_dispatch.y, bf16_dispatch.y));
  EXPECT_TRUE(torch::equal(fp8_dispatch.dx, bf16_dispatch.dx));
  // The wgrad's input is the received values' transposed cast: what a bf16 dispatch of those
  // values would give (their row-wise codes may differ from x's: casting dequantized values again
  // is not idempotent, but only the transposed copy reaches the wgrad).
  auto e = cpu_engine(GetParam());
  const Run of_values = run(fp8::dequantize_packed_rows(*e, fp8::quantize_packed_rows(*e, x), kCols), false);
  for (size_t i = 0; i < kSplits.size(); ++i) {
    EXPECT_TRUE(torch::equal(fp8_dispatch.dw[i], of_values.dw[i])) << "expert " << i;
    EXPECT_TRUE(torch::equal(fp8_dispatch.db[i], bf16_dispatch.db[i])) << "expert " << i;
    // One more rounding of the wgrad's operand, at FP8's resolution (E4M3: 2^-4 relative).
    const double rel = (fp8_dispatch.dw[i] - bf16_dispatch.dw[i]).norm().item<double>() /
                       std::max(bf16_dispatch.dw[i].norm().item<double>(), 1e-30);
    EXPECT_LT(rel, 0.1) << "expert " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(BlockRecipes, PackedRows, ::testing::Values(fp8::RecipeKind::kBlockwise, fp8::RecipeKind::kMxfp8),
                         [](const auto& info) { return std::string(fp8::recipe_kind_name(info.param)); });

TEST(PackedRowsLayout, BytesPerToken) {
  // H codes and the row's scales: fp32 per 1x128 block, one E8M0 byte per 1x32 block.
  const auto block = fp8::packed_row_layout(fp8::make_recipe(fp8::RecipeKind::kBlockwise, fp8::Fp8Format::kE4M3), 4096);
  EXPECT_EQ(block.row_bytes(), 4096 + 32 * 4);
  const auto mx = fp8::packed_row_layout(fp8::make_recipe(fp8::RecipeKind::kMxfp8, fp8::Fp8Format::kE4M3), 4096);
  EXPECT_EQ(mx.row_bytes(), 4096 + 128);
  EXPECT_EQ(fp8::packed_row_layout(fp8::make_recipe(fp8::RecipeKind::kBlockwise, fp8::Fp8Format::kE4M3), 160).row_bytes(),
            160 + 2 * 4);
  // Per-tensor recipes have no row-local scales.
  EXPECT_USER_ERROR(fp8::packed_row_layout(fp8::make_recipe(fp8::RecipeKind::kDelayed, fp8::Fp8Format::kHybrid), 4096),
                    "per-block recipe");
  EXPECT_USER_ERROR(fp8::packed_row_layout(fp8::make_recipe(fp8::RecipeKind::kTensorwise, fp8::Fp8Format::kHybrid), 4096),
                    "per-block recipe");
  EXPECT_TRUE(fp8::quantizes_rows_alone(fp8::make_recipe(fp8::RecipeKind::kMxfp8, fp8::Fp8Format::kE4M3)));
  EXPECT_FALSE(fp8::quantizes_rows_alone(fp8::make_recipe(fp8::RecipeKind::kTensorwise, fp8::Fp8Format::kE4M3)));
}

std::vector<std::string> moe_fp8_args(const std::string& recipe, std::initializer_list<std::string> extra = {}) {
  auto a = tiny_args({"--attention-dropout", "0", "--hidden-dropout", "0", "--num-experts", "4", "--moe-ffn-hidden-size",
                      "32", "--moe-layer-freq", "([0]+[1])", "--moe-token-dispatcher-type", "alltoall", "--fp8-format",
                      "e4m3", "--fp8-recipe", recipe});
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

TensorParallelContext no_tp() { return TensorParallelContext{make_self_communicator("tp", 0), 0, 1, false}; }

// One MoE layer in one process (the alltoall path without an exchange), with and without the flag:
// the same output and input gradient, router and fc2 gradients bit for bit; fc1's weight gradients
// within FP8's resolution of each other. With the routing map padded for FP8 too.
TEST(MoeDispatchFp8, LayerIsTheBf16DispatchsButForFc1WeightGradients) {
  for (const std::string recipe : {"blockwise", "mxfp8"})
    for (auto padding : {std::vector<std::string>{}, std::vector<std::string>{"--moe-router-padding-for-quantization"}}) {
      struct Run {
        torch::Tensor y, dx;
        std::map<std::string, torch::Tensor> grads;
        bool fp8_input = false;
      };
      auto run = [&](bool flag) {
        auto args = moe_fp8_args(recipe);
        args.insert(args.end(), padding.begin(), padding.end());
        if (flag) args.push_back("--moe-dispatch-fp8");
        const ModelConfig m = build(args).model;
        EXPECT_EQ(m.moe.dispatch_fp8, flag);
        auto engine = cpu_engine(recipe == "mxfp8" ? fp8::RecipeKind::kMxfp8 : fp8::RecipeKind::kBlockwise);
        auto context = std::make_shared<MoeContext>(m.moe, m.num_layers, ExpertParallelGroups::single_process());
        MoeLayer layer(m, "decoder.layers.1.mlp", 1, ModuleFactory(m.seed, no_tp(), engine), context);
        layer->train();
        torch::manual_seed(5);
        auto x = torch::randn({m.seq_length, 2, m.hidden_size}).requires_grad_(true);
        auto y = layer(x);
        y.pow(2).sum().backward();
        Run r{y.detach(), x.grad(), {}, layer->experts->linear_fc1->input_dispatched_fp8};
        for (const auto& p : layer->named_parameters())
          if (p.value().grad().defined()) r.grads[p.key()] = p.value().grad().clone();
        EXPECT_EQ(context->take_dispatch_bytes(), 0);  // one process: nothing crosses a wire
        return r;
      };
      const Run off = run(false), on = run(true);
      SCOPED_TRACE(recipe + (padding.empty() ? "" : " with router padding"));
      EXPECT_FALSE(off.fp8_input);
      EXPECT_TRUE(on.fp8_input);
      EXPECT_TRUE(torch::equal(on.y, off.y));
      EXPECT_TRUE(torch::equal(on.dx, off.dx));
      ASSERT_EQ(on.grads.size(), off.grads.size());
      for (const auto& [name, g] : off.grads) {
        const auto& other = on.grads.at(name);
        if (name.find("linear_fc1.weight") != std::string::npos) {
          const double rel = (other - g).norm().item<double>() / std::max(g.norm().item<double>(), 1e-30);
          EXPECT_LT(rel, 0.1) << name;
        } else {
          EXPECT_TRUE(torch::equal(other, g)) << name;
        }
      }
    }
}

// End to end: the flag trains, its first loss (the forward of the same weights) is the run's
// without it, bit for bit; later ones drift by the fc1 weight gradients' extra rounding only.
TEST(MoeDispatchFp8, TrainsWithTheFirstLossOfTheBf16Dispatch) {
  auto config = [](bool flag) {
    auto args = moe_fp8_args("blockwise", {"--global-batch-size", "4", "--train-iters", "6", "--lr", "3e-3",
                                           "--log-interval", "100", "--eval-iters", "0", "--device", "cpu"});
    if (flag) args.push_back("--moe-dispatch-fp8");
    return build(args);
  };
  const TrainResult off = train(config(false), TrainOptions{});
  const TrainResult on = train(config(true), TrainOptions{});
  ASSERT_EQ(on.losses.size(), off.losses.size());
  EXPECT_EQ(on.losses.front(), off.losses.front());
  for (size_t i = 0; i < on.losses.size(); ++i) {
    EXPECT_TRUE(std::isfinite(on.losses[i]));
    EXPECT_NEAR(on.losses[i], off.losses[i], 1e-3 * std::abs(off.losses[i])) << "iteration " << i + 1;
  }
  EXPECT_LT(on.losses.back(), on.losses.front());
}

}  // namespace
}  // namespace fp8tron
