// TEGroupedLinear (models/linear/grouped_linear.h, fp8/fp8_grouped_linear.h) on the CPU: the bf16 path
// against per-expert F::linear, the FP8 path for every recipe against per-expert fp8_linear with
// separate sites on zero-padded rows (bitwise, aligned and unaligned token counts, idle experts),
// --no-use-gmm-fp8, tensor-parallel shards and partial sums, and bad token splits.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <optional>

#include "fp8/fp8_grouped_linear.h"
#include "fp8/fp8_linear.h"
#include "fp8/swiglu_backward.h"
#include "models/linear/grouped_linear.h"
#include "models/linear/modules.h"
#include "parallel/parallel_state.h"
#include "tests/test_helpers.h"

namespace fp8tron {
namespace {

constexpr int64_t kIn = 32, kOut = 48, kExperts = 4;
constexpr uint64_t kSeed = 1234;
const std::string kName = "decoder.layers.1.mlp.experts.linear_fc1";

ModuleFactory factory(std::shared_ptr<fp8::Fp8Engine> engine = nullptr, int tp_size = 1, int tp_rank = 0) {
  TensorParallelContext tp{make_self_communicator("tp", tp_rank), tp_rank, tp_size, false};
  return ModuleFactory(kSeed, tp, std::move(engine));
}

GroupedLinearOptions options(GroupedParallelMode mode = GroupedParallelMode::kColumn) {
  GroupedLinearOptions o;
  o.in_features = kIn;
  o.out_features = kOut;
  o.num_gemms = kExperts;
  o.bias = true;
  o.init_name = kName;
  o.parallel_mode = mode;
  return o;
}

// Biases start at zero; random ones make the comparisons see them.
void randomize_biases(TEGroupedLinear& m, uint64_t seed) {
  torch::manual_seed(seed);
  torch::NoGradGuard no_grad;
  for (auto& b : m->biases) b.copy_(torch::randn(b.sizes()) * 0.1);
}

int64_t total(const std::vector<int64_t>& splits) {
  int64_t n = 0;
  for (auto s : splits) n += s;
  return n;
}

// The module's output and gradients for input x and output gradient dy.
struct Result {
  torch::Tensor y, dx;
  std::vector<torch::Tensor> dw, db;
};
Result run_module(TEGroupedLinear& m, const torch::Tensor& x_in, const std::vector<int64_t>& splits,
               const torch::Tensor& dy) {
  auto x = x_in.clone().requires_grad_(true);
  Result r;
  r.y = m(x, splits);
  r.y.backward(dy);
  r.dx = x.grad();
  for (auto& w : m->weights) r.dw.push_back(w.grad());
  for (auto& b : m->biases) r.db.push_back(b.grad());
  return r;
}

// The reference: each non-empty slice through `linear` with fresh copies of the parameters.
template <typename Linear>
Result run_reference(const TEGroupedLinear& m, const torch::Tensor& x_in, const std::vector<int64_t>& splits,
                  const torch::Tensor& dy, Linear linear) {
  auto x = x_in.clone().requires_grad_(true);
  std::vector<torch::Tensor> ws, bs, ys;
  int64_t row = 0;
  for (size_t i = 0; i < splits.size(); ++i) {
    ws.push_back(m->weights[i].detach().clone().requires_grad_(true));
    bs.push_back(m->biases[i].detach().clone().requires_grad_(true));
    if (splits[i] > 0) ys.push_back(linear(i, x.narrow(0, row, splits[i]), ws[i], bs[i]));
    row += splits[i];
  }
  Result r;
  r.y = torch::cat(ys, 0);
  r.y.backward(dy);
  r.dx = x.grad();
  for (size_t i = 0; i < splits.size(); ++i) {
    // An expert without tokens gets a zero gradient from the module.
    r.dw.push_back(ws[i].grad().defined() ? ws[i].grad() : torch::zeros_like(ws[i]));
    r.db.push_back(bs[i].grad().defined() ? bs[i].grad() : torch::zeros_like(bs[i]));
  }
  return r;
}

void expect_equal(const Result& got, const Result& want) {
  EXPECT_TRUE(torch::equal(got.y, want.y));
  EXPECT_TRUE(torch::equal(got.dx, want.dx));
  ASSERT_EQ(got.dw.size(), want.dw.size());
  ASSERT_EQ(got.db.size(), want.db.size());
  for (size_t i = 0; i < got.dw.size(); ++i) {
    SCOPED_TRACE("expert " + std::to_string(i));
    ASSERT_TRUE(got.dw[i].defined());
    ASSERT_TRUE(got.db[i].defined());
    EXPECT_TRUE(torch::equal(got.dw[i], want.dw[i]));
    EXPECT_TRUE(torch::equal(got.db[i], want.db[i]));
  }
}

TEST(TEGroupedLinear, Bf16PathIsPerExpertLinearIncludingAnIdleExpert) {
  auto m = TEGroupedLinear(options(), factory());
  randomize_biases(m, 1);
  EXPECT_TRUE(m->fp8_sites.empty());
  const std::vector<int64_t> splits = {5, 0, 11, 8};
  torch::manual_seed(2);
  auto x = torch::randn({total(splits), kIn});
  auto dy = torch::randn({total(splits), kOut});
  const Result got = run_module(m, x, splits, dy);
  const Result want = run_reference(m, x, splits, dy, [](size_t, const torch::Tensor& xi, const torch::Tensor& w,
                                                      const torch::Tensor& b) { return torch::nn::functional::linear(xi, w, b); });
  EXPECT_EQ(got.y.sizes(), (std::vector<int64_t>{total(splits), kOut}));
  expect_equal(got, want);
  EXPECT_EQ(got.dw[1].abs().max().item<float>(), 0.0f);
  EXPECT_EQ(got.db[1].abs().max().item<float>(), 0.0f);
}

struct RecipeCase {
  fp8::RecipeKind kind;
  fp8::Fp8Format format;
};
const RecipeCase kRecipes[] = {{fp8::RecipeKind::kDelayed, fp8::Fp8Format::kHybrid},
                               {fp8::RecipeKind::kDelayed, fp8::Fp8Format::kE4M3},
                               {fp8::RecipeKind::kTensorwise, fp8::Fp8Format::kHybrid},
                               {fp8::RecipeKind::kTensorwise, fp8::Fp8Format::kHiF8},
                               {fp8::RecipeKind::kBlockwise, fp8::Fp8Format::kE4M3},
                               {fp8::RecipeKind::kMxfp8, fp8::Fp8Format::kE4M3},
                               {fp8::RecipeKind::kMxfp8, fp8::Fp8Format::kHybrid}};

std::shared_ptr<fp8::Fp8Engine> cpu_engine(const RecipeCase& c) {
  fp8::Fp8EngineOptions o;
  o.recipe = fp8::make_recipe(c.kind, c.format);
  o.num_layers = 4;
  return std::make_shared<fp8::Fp8Engine>(o, torch::Device(torch::kCPU));
}

// The rows of t padded with zero rows to `rows` (Megatron/TE's Fp8Padding).
torch::Tensor pad_rows(const torch::Tensor& t, int64_t rows) {
  if (t.size(0) == rows) return t;
  return torch::cat({t, torch::zeros({rows - t.size(0), t.size(1)}, t.options())});
}

// The FP8 reference: each expert's rows padded with zero rows to the recipe's alignment, through
// its own fp8_linear site (of a second engine, registered in the same order), padding rows of the
// output dropped; the output gradient's padding rows are zero.
Result run_padded_fp8_reference(const TEGroupedLinear& m, fp8::Fp8Engine& engine,
                                const std::vector<std::shared_ptr<fp8::Fp8Site>>& sites, const torch::Tensor& x_in,
                                const std::vector<int64_t>& splits, const torch::Tensor& dy) {
  const int64_t align = int64_t(fp8::fp8_token_alignment(engine.recipe()));
  auto x = x_in.clone().requires_grad_(true);
  std::vector<torch::Tensor> ws, bs, ys;
  int64_t row = 0;
  for (size_t i = 0; i < splits.size(); ++i) {
    ws.push_back(m->weights[i].detach().clone().requires_grad_(true));
    bs.push_back(m->biases[i].detach().clone().requires_grad_(true));
    if (splits[i] > 0) {
      const int64_t padded = (splits[i] + align - 1) / align * align;
      auto yi = fp8::fp8_linear(pad_rows(x.narrow(0, row, splits[i]), padded), ws[i], bs[i], *sites[i]);
      ys.push_back(yi.narrow(0, 0, splits[i]));
    }
    row += splits[i];
  }
  Result r;
  r.y = torch::cat(ys, 0);
  r.y.backward(dy);
  r.dx = x.grad();
  for (size_t i = 0; i < splits.size(); ++i) {
    r.dw.push_back(ws[i].grad().defined() ? ws[i].grad() : torch::zeros_like(ws[i]));
    r.db.push_back(bs[i].grad().defined() ? bs[i].grad() : torch::zeros_like(bs[i]));
  }
  return r;
}

// Every recipe, aligned and unaligned token counts and an idle expert, two steps (the second on
// updated delayed scales): outputs, gradients and the delayed-scaling state equal one fp8_linear
// per expert on its zero-padded rows, bit for bit.
TEST(TEGroupedLinear, Fp8EveryRecipeIsPerExpertFp8LinearOnZeroPaddedRows) {
  const std::vector<std::vector<int64_t>> split_cases = {{16, 0, 32, 16}, {5, 0, 19, 12}, {1, 33, 0, 40}};
  for (const RecipeCase& c : kRecipes) {
    for (const auto& splits : split_cases) {
      SCOPED_TRACE(std::string(fp8::recipe_kind_name(c.kind)) + " " + fp8::fp8_format_name(c.format) + " splits " +
                   std::to_string(splits[0]) + "," + std::to_string(splits[1]) + "," + std::to_string(splits[2]) + "," +
                   std::to_string(splits[3]));
      auto engine = cpu_engine(c);
      auto m = TEGroupedLinear(options(), factory(engine));
      randomize_biases(m, 3);
      ASSERT_EQ(m->fp8_sites.size(), size_t(kExperts));
      ASSERT_EQ(engine->num_sites(), size_t(kExperts));
      for (int64_t i = 0; i < kExperts; ++i) {
        ASSERT_TRUE(m->fp8_sites[size_t(i)]);
        EXPECT_EQ(m->fp8_sites[size_t(i)]->name, kName + ".weight" + std::to_string(i));
        EXPECT_TRUE(m->fp8_sites[size_t(i)]->parameter.is_same(m->weights[size_t(i)]));
      }
      auto reference_engine = cpu_engine(c);
      std::vector<std::shared_ptr<fp8::Fp8Site>> sites;
      for (int64_t i = 0; i < kExperts; ++i)
        sites.push_back(reference_engine->add_site(kName + ".weight" + std::to_string(i), 1, kOut, kIn));
      for (int step = 0; step < 2; ++step) {
        SCOPED_TRACE("step " + std::to_string(step));
        torch::manual_seed(4 + step);
        auto x = torch::randn({total(splits), kIn}) * (step + 1);
        auto dy = torch::randn({total(splits), kOut}) * 1e-2;
        for (auto& p : m->parameters()) p.mutable_grad() = torch::Tensor();
        const Result got = run_module(m, x, splits, dy);
        const Result want = run_padded_fp8_reference(m, *reference_engine, sites, x, splits, dy);
        expect_equal(got, want);
        for (size_t i = 0; i < splits.size(); ++i) {
          if (splits[i] > 0) {
            EXPECT_GT(got.dw[i].abs().max().item<float>(), 0.0f) << "expert " << i;
            continue;
          }
          EXPECT_EQ(got.dw[i].abs().max().item<float>(), 0.0f) << "idle expert " << i;
          EXPECT_EQ(got.db[i].abs().max().item<float>(), 0.0f) << "idle expert " << i;
        }
        if (c.kind == fp8::RecipeKind::kDelayed) {
          EXPECT_TRUE(torch::equal(engine->history(), reference_engine->history()));
          EXPECT_TRUE(torch::equal(engine->scale(), reference_engine->scale()));
        }
        // And it is FP8: not the exact product.
        const int64_t e0 = splits[0] > 0 ? 0 : 1;
        auto exact = torch::nn::functional::linear(x.narrow(0, 0, splits[size_t(e0)]), m->weights[size_t(e0)].detach(),
                                                   m->biases[size_t(e0)].detach());
        EXPECT_FALSE(torch::equal(got.y.narrow(0, 0, splits[size_t(e0)]), exact));
        engine->end_step(nullptr);
        reference_engine->end_step(nullptr);
      }
    }
  }
}

// The padding is zero rows: an expert's output rows do not depend on how many tokens the other
// experts got, nor on where its rows sit, and an idle expert records no amax.
TEST(TEGroupedLinear, Fp8ExpertRowsDoNotDependOnTheOtherExperts) {
  for (const RecipeCase& c : kRecipes) {
    SCOPED_TRACE(std::string(fp8::recipe_kind_name(c.kind)) + " " + fp8::fp8_format_name(c.format));
    auto run = [&](const std::vector<int64_t>& splits, const torch::Tensor& x) {
      auto engine = cpu_engine(c);
      auto m = TEGroupedLinear(options(), factory(engine));
      randomize_biases(m, 9);
      auto y = m(x, splits);
      if (c.kind == fp8::RecipeKind::kDelayed) {
        const auto history = engine->history();
        for (size_t i = 0; i < splits.size(); ++i) {
          if (splits[i] == 0) {
            EXPECT_EQ(history[0][int64_t(engine->slot(*m->fp8_sites[i], fp8::TensorRole::kInput))].item<float>(), 0.0f);
          }
        }
      }
      return y;
    };
    torch::manual_seed(11);
    auto a = torch::randn({7, kIn}), b = torch::randn({21, kIn}), d = torch::randn({3, kIn});
    auto y1 = run({7, 21, 0, 3}, torch::cat({a, b, d}));
    auto y2 = run({7, 0, 0, 3}, torch::cat({a, d}));
    EXPECT_TRUE(torch::equal(y1.narrow(0, 0, 7), y2.narrow(0, 0, 7)));
    EXPECT_TRUE(torch::equal(y1.narrow(0, 28, 3), y2.narrow(0, 7, 3)));
  }
}

// Inference (no autograd) gives the training forward's output; an input that needs no gradient
// still gives the weights theirs, and the weights that need none get none.
TEST(TEGroupedLinear, InferenceAndPartialGradients) {
  const std::vector<int64_t> splits = {9, 0, 23, 16};
  for (const bool fp8_run : {false, true}) {
    SCOPED_TRACE(fp8_run ? "fp8" : "bf16");
    auto engine = fp8_run ? cpu_engine({fp8::RecipeKind::kTensorwise, fp8::Fp8Format::kHybrid}) : nullptr;
    auto m = TEGroupedLinear(options(), factory(engine));
    randomize_biases(m, 21);
    torch::manual_seed(22);
    auto x = torch::randn({total(splits), kIn});
    auto dy = torch::randn({total(splits), kOut});
    const Result full = run_module(m, x, splits, dy);
    torch::Tensor y_inference;
    {
      torch::NoGradGuard no_grad;
      y_inference = m->forward(x, splits);
    }
    EXPECT_TRUE(torch::equal(y_inference, full.y));
    EXPECT_FALSE(y_inference.requires_grad());
    for (auto& p : m->parameters()) p.mutable_grad() = torch::Tensor();
    m->weights[2].requires_grad_(false);
    auto y = m->forward(x, splits);  // x needs no gradient
    y.backward(dy);
    EXPECT_TRUE(torch::equal(y, full.y));
    EXPECT_FALSE(m->weights[2].grad().defined());
    EXPECT_TRUE(torch::equal(m->weights[0].grad(), full.dw[0]));
    EXPECT_TRUE(torch::equal(m->weights[3].grad(), full.dw[3]));
    EXPECT_TRUE(torch::equal(m->biases[2].grad(), full.db[2]));
    m->weights[2].requires_grad_(true);
  }
}

// The module's FP8 sites as grouped_linear takes them (empty for bf16 experts).
std::vector<fp8::Fp8Site*> site_pointers(TEGroupedLinear& m) {
  std::vector<fp8::Fp8Site*> out;
  for (auto& s : m->fp8_sites) out.push_back(s.get());
  return out;
}

// Prologue::kSwiglu (an MoE fc2 reading fc1's [gate | up] output): on every FP8 path that cannot
// fuse it (the CPU path here) and for bf16 experts, the same outputs and gradients, bit for bit,
// as the SwiGLU in torch's ops followed by the plain grouped linear; the gradient of h comes
// through the node's own SwiGLU backward. (The fused GPU cast: GpuFp8's grouped SwiGLU test.)
TEST(TEGroupedLinear, SwigluPrologueIsTorchsSwigluThenTheGroupedLinear) {
  const std::vector<int64_t> splits = {5, 0, 19, 12};
  std::vector<std::optional<RecipeCase>> cases = {std::nullopt};
  for (const RecipeCase& c : kRecipes) cases.push_back(c);
  for (const auto& c : cases) {
    SCOPED_TRACE(c ? std::string(fp8::recipe_kind_name(c->kind)) + " " + fp8::fp8_format_name(c->format) : "bf16");
    auto fused_engine = c ? cpu_engine(*c) : nullptr, plain_engine = c ? cpu_engine(*c) : nullptr;
    auto fused = TEGroupedLinear(options(), factory(fused_engine)), plain = TEGroupedLinear(options(), factory(plain_engine));
    randomize_biases(fused, 3);
    randomize_biases(plain, 3);
    EXPECT_FALSE(fused->fuses_swiglu());  // only native FP8 GEMMs with delayed scaling fuse it
    for (int step = 0; step < 2; ++step) {
      SCOPED_TRACE("step " + std::to_string(step));
      torch::manual_seed(40 + step);
      const auto h0 = torch::randn({total(splits), 2 * kIn}) * (step + 1);
      const auto dy = torch::randn({total(splits), kOut}) * 1e-2;
      auto run = [&](TEGroupedLinear& m, bool with_prologue) {
        for (auto& p : m->parameters()) p.mutable_grad() = torch::Tensor();
        auto h = h0.clone().requires_grad_(true);
        auto y = with_prologue ? fp8::grouped_linear(h, splits, m->weights, m->biases, site_pointers(m),
                                                     fp8::Bf16GroupedBackend::kCublasLt, fp8::Prologue::kSwiglu)
                               : m(fp8::torch_swiglu(h), splits);
        y.backward(dy);
        Result r;
        r.y = y.detach();
        r.dx = h.grad();
        for (auto& w : m->weights) r.dw.push_back(w.grad());
        for (auto& b : m->biases) r.db.push_back(b.grad());
        return r;
      };
      const Result got = run(fused, true), want = run(plain, false);
      expect_equal(got, want);
      EXPECT_GT(got.dx.abs().max().item<float>(), 0.0f);
      if (c && c->kind == fp8::RecipeKind::kDelayed) EXPECT_TRUE(torch::equal(fused_engine->history(), plain_engine->history()));
      if (fused_engine) fused_engine->end_step(nullptr);
      if (plain_engine) plain_engine->end_step(nullptr);
    }
  }
}

// fc1 -> SwiGLU -> fc2 with the SwiGLU as fc2's prologue: fc1's node takes over SwiGLU's backward
// (the hand-over; on the CPU it applies the unfused backward) and every gradient is, bit for bit,
// that of fc1 -> torch's SwiGLU -> fc2, on every FP8 recipe.
TEST(TEGroupedLinear, SwigluHandOverToFc1MatchesTheUnfusedChain) {
  const std::vector<int64_t> splits = {5, 0, 19, 12};
  for (const RecipeCase& c : kRecipes) {
    SCOPED_TRACE(std::string(fp8::recipe_kind_name(c.kind)) + " " + fp8::fp8_format_name(c.format));
    struct Mlp {
      std::shared_ptr<fp8::Fp8Engine> engine;
      TEGroupedLinear fc1{nullptr}, fc2{nullptr};
    };
    auto make = [&] {
      Mlp m{cpu_engine(c)};
      GroupedLinearOptions o1 = options();
      o1.out_features = 2 * kIn;
      m.fc1 = TEGroupedLinear(o1, factory(m.engine));
      GroupedLinearOptions o2 = options(GroupedParallelMode::kRow);
      o2.init_name = "decoder.layers.1.mlp.experts.linear_fc2";
      m.fc2 = TEGroupedLinear(o2, factory(m.engine));
      randomize_biases(m.fc1, 5);
      randomize_biases(m.fc2, 6);
      return m;
    };
    Mlp fused = make(), plain = make();
    for (int step = 0; step < 2; ++step) {
      SCOPED_TRACE("step " + std::to_string(step));
      torch::manual_seed(50 + step);
      const auto x0 = torch::randn({total(splits), kIn}) * (step + 1), dy = torch::randn({total(splits), kOut}) * 1e-2;
      auto run = [&](Mlp& m, bool hand_over) {
        for (auto* mod : {&m.fc1, &m.fc2})
          for (auto& p : (*mod)->parameters()) p.mutable_grad() = torch::Tensor();
        auto x = x0.clone().requires_grad_(true);
        auto h = m.fc1(x, splits);
        torch::Tensor y;
        if (hand_over) {
          y = fp8::grouped_linear(h, splits, m.fc2->weights, m.fc2->biases, site_pointers(m.fc2),
                                  fp8::Bf16GroupedBackend::kCublasLt, fp8::Prologue::kSwiglu);
          EXPECT_TRUE(fp8::grouped_hands_over_swiglu_backward(h));
        } else {
          y = m.fc2(fp8::torch_swiglu(h), splits);
          EXPECT_FALSE(fp8::grouped_hands_over_swiglu_backward(h));
        }
        y.backward(dy);
        EXPECT_FALSE(fp8::grouped_hands_over_swiglu_backward(h));  // released by the backward
        std::vector<torch::Tensor> out{y.detach(), x.grad()};
        for (auto* mod : {&m.fc1, &m.fc2}) {
          for (auto& w : (*mod)->weights) out.push_back(w.grad());
          for (auto& b : (*mod)->biases) out.push_back(b.grad());
        }
        return out;
      };
      const auto got = run(fused, true), want = run(plain, false);
      ASSERT_EQ(got.size(), want.size());
      for (size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(torch::equal(got[i], want[i])) << "output " << i;
      if (c.kind == fp8::RecipeKind::kDelayed) EXPECT_TRUE(torch::equal(fused.engine->history(), plain.engine->history()));
      fused.engine->end_step(nullptr);
      plain.engine->end_step(nullptr);
    }
  }
}

TEST(TEGroupedLinear, Fp8WithoutTokensAtAll) {
  auto engine = cpu_engine({fp8::RecipeKind::kDelayed, fp8::Fp8Format::kHybrid});
  auto m = TEGroupedLinear(options(), factory(engine));
  auto x = torch::zeros({0, kIn}).requires_grad_(true);
  auto y = m->forward(x, {0, 0, 0, 0});
  EXPECT_EQ(y.sizes(), (std::vector<int64_t>{0, kOut}));
  y.sum().backward();
  for (auto& w : m->weights) {
    ASSERT_TRUE(w.grad().defined());
    EXPECT_EQ(w.grad().abs().max().item<float>(), 0.0f);
  }
  EXPECT_EQ(x.grad().sizes(), x.sizes());
}

// Against one TEColumnParallelLinear per expert (the dense TE module, its own FP8 site), with the
// experts' weights copied in: bf16 and FP8, aligned token counts (a dense layer refuses others).
TEST(TEGroupedLinear, EqualsOneTeLinearPerExpert) {
  const std::vector<int64_t> splits = {32, 16, 0, 48};
  for (const bool fp8_run : {false, true}) {
    for (const RecipeCase& c : {kRecipes[0], kRecipes[4]}) {
      SCOPED_TRACE(fp8_run ? fp8::recipe_kind_name(c.kind) : "bf16");
      auto engine = fp8_run ? cpu_engine(c) : nullptr;
      auto m = TEGroupedLinear(options(), factory(engine));
      randomize_biases(m, 13);
      auto reference_engine = fp8_run ? cpu_engine(c) : nullptr;
      std::vector<TEColumnParallelLinear> linears;
      for (int64_t i = 0; i < kExperts; ++i) {
        LinearOptions lo;
        lo.in_features = kIn;
        lo.out_features = kOut;
        lo.init_name = kName + ".weight" + std::to_string(i);
        linears.push_back(TEColumnParallelLinear(lo, factory(reference_engine)));
        torch::NoGradGuard no_grad;
        linears.back()->weight.copy_(m->weights[size_t(i)]);
        linears.back()->bias.copy_(m->biases[size_t(i)]);
        ASSERT_EQ(bool(linears.back()->fp8_site), fp8_run);
      }
      torch::manual_seed(14);
      auto x = torch::randn({total(splits), kIn});
      auto dy = torch::randn({total(splits), kOut}) * 1e-2;
      const Result got = run_module(m, x, splits, dy);
      // The linears hold their own parameters: their gradients are read from them below.
      const Result want = run_reference(m, x, splits, dy, [&](size_t i, const torch::Tensor& xi, const torch::Tensor&,
                                                           const torch::Tensor&) { return linears[i](xi); });
      EXPECT_TRUE(torch::equal(got.y, want.y));
      EXPECT_TRUE(torch::equal(got.dx, want.dx));
      for (int64_t i = 0; i < kExperts; ++i) {
        SCOPED_TRACE("expert " + std::to_string(i));
        const auto& l = linears[size_t(i)];
        const auto dw = l->weight.grad().defined() ? l->weight.grad() : torch::zeros_like(l->weight);
        const auto db = l->bias.grad().defined() ? l->bias.grad() : torch::zeros_like(l->bias);
        EXPECT_TRUE(torch::equal(got.dw[size_t(i)], dw));
        EXPECT_TRUE(torch::equal(got.db[size_t(i)], db));
      }
      if (!fp8_run) break;
    }
  }
}

TEST(TEGroupedLinear, NoGmmFp8RunsTheBf16Gemms) {
  const std::vector<int64_t> splits = {5, 0, 11, 8};  // bf16 takes any token count
  torch::manual_seed(5);
  auto x = torch::randn({total(splits), kIn});
  auto dy = torch::randn({total(splits), kOut});
  auto plain = TEGroupedLinear(options(), factory());
  randomize_biases(plain, 6);
  const Result want = run_module(plain, x, splits, dy);

  auto engine = cpu_engine({fp8::RecipeKind::kTensorwise, fp8::Fp8Format::kHybrid});
  auto o = options();
  o.use_fp8 = false;
  auto no_gmm_fp8 = TEGroupedLinear(o, factory(engine));
  EXPECT_TRUE(no_gmm_fp8->fp8_sites.empty());
  EXPECT_EQ(engine->num_sites(), 0u);
  randomize_biases(no_gmm_fp8, 6);
  expect_equal(run_module(no_gmm_fp8, x, splits, dy), want);

  // Blockwise runs FP8 expert GEMMs (no bf16 fallback).
  auto blockwise_engine = cpu_engine({fp8::RecipeKind::kBlockwise, fp8::Fp8Format::kE4M3});
  auto blockwise = TEGroupedLinear(options(), factory(blockwise_engine));
  EXPECT_EQ(blockwise->fp8_sites.size(), size_t(kExperts));
  EXPECT_EQ(blockwise_engine->num_sites(), size_t(kExperts));
}

// Parameter names, shard shapes, ParamInfo and outputs with a tensor-parallel group of two (each
// rank's module built in this process; the module itself communicates nothing).
TEST(TEGroupedLinear, TensorParallelShardsConcatenateToTheGlobalWeights) {
  const std::vector<int64_t> splits = {3, 0, 6, 7};
  torch::manual_seed(7);
  auto x = torch::randn({total(splits), kIn});
  auto dy = torch::randn({total(splits), kOut});
  for (auto mode : {GroupedParallelMode::kColumn, GroupedParallelMode::kRow}) {
    const bool column = mode == GroupedParallelMode::kColumn;
    SCOPED_TRACE(column ? "column" : "row");
    auto global = TEGroupedLinear(options(mode), factory());
    randomize_biases(global, 8);
    const Result want = run_module(global, x, splits, dy);

    std::vector<TEGroupedLinear> ranks;
    std::vector<Result> runs;
    for (int r = 0; r < 2; ++r) {
      ranks.push_back(TEGroupedLinear(options(mode), factory(nullptr, 2, r)));
      auto& m = ranks.back();
      std::vector<std::string> names;
      for (const auto& p : m->named_parameters()) names.push_back(p.key());
      EXPECT_EQ(names, (std::vector<std::string>{"weight0", "bias0", "weight1", "bias1", "weight2", "bias2", "weight3",
                                                  "bias3"}));
      const auto& infos = m->param_infos();
      for (int64_t i = 0; i < kExperts; ++i) {
        const auto& w = m->weights[size_t(i)];
        const auto& b = m->biases[size_t(i)];
        EXPECT_EQ(w.sizes(), column ? (std::vector<int64_t>{kOut / 2, kIn}) : (std::vector<int64_t>{kOut, kIn / 2}));
        EXPECT_EQ(b.sizes(), column ? (std::vector<int64_t>{kOut / 2}) : (std::vector<int64_t>{kOut}));
        const ParamInfo& wi = infos.at("weight" + std::to_string(i));
        const ParamInfo& bi = infos.at("bias" + std::to_string(i));
        EXPECT_EQ(wi.global_shape, (std::vector<int64_t>{kOut, kIn}));
        EXPECT_EQ(wi.partition_dim, column ? 0 : 1);
        EXPECT_FALSE(wi.reduce_grad_over_tp);
        EXPECT_EQ(bi.global_shape, (std::vector<int64_t>{kOut}));
        EXPECT_EQ(bi.partition_dim, column ? 0 : -1);
        EXPECT_EQ(bi.reduce_grad_over_tp, !column);  // row: only rank 0 adds the bias
        // The rank-0 and rank-1 shards of a weight differ (each is seeded from the global one).
        if (r == 1) EXPECT_FALSE(torch::equal(ranks[0]->weights[size_t(i)], w));
      }
      {
        // This rank's share of the global biases.
        torch::NoGradGuard no_grad;
        for (int64_t i = 0; i < kExperts; ++i) {
          auto gb = global->biases[size_t(i)].detach();
          m->biases[size_t(i)].copy_(column ? gb.chunk(2, 0)[size_t(r)] : gb);
        }
      }
      // Column: the whole input, this rank's output features. Row: this rank's input features,
      // partial sums of all output features.
      auto xr = column ? x : x.chunk(2, 1)[size_t(r)].contiguous();
      auto dyr = column ? dy.chunk(2, 1)[size_t(r)].contiguous() : dy;
      runs.push_back(run_module(m, xr, splits, dyr));
    }
    const int dim = column ? 0 : 1;
    for (int64_t i = 0; i < kExperts; ++i) {
      SCOPED_TRACE("expert " + std::to_string(i));
      const size_t e = size_t(i);
      EXPECT_TRUE(torch::equal(torch::cat({ranks[0]->weights[e], ranks[1]->weights[e]}, dim), global->weights[e]));
      EXPECT_TRUE(torch::allclose(torch::cat({runs[0].dw[e], runs[1].dw[e]}, dim), want.dw[e], 1e-5, 1e-6));
      if (column) {
        EXPECT_TRUE(torch::allclose(torch::cat({runs[0].db[e], runs[1].db[e]}, 0), want.db[e], 1e-5, 1e-6));
      } else {
        // Rank 0's bias gradient is the whole one; summed over the group (reduce_grad_over_tp).
        ASSERT_TRUE(runs[0].db[e].defined());
        auto db1 = runs[1].db[e].defined() ? runs[1].db[e] : torch::zeros_like(runs[0].db[e]);
        EXPECT_TRUE(torch::allclose(runs[0].db[e] + db1, want.db[e], 1e-5, 1e-6));
      }
    }
    if (column) {
      EXPECT_TRUE(torch::allclose(torch::cat({runs[0].y, runs[1].y}, 1), want.y, 1e-5, 1e-6));
      EXPECT_TRUE(torch::allclose(runs[0].dx + runs[1].dx, want.dx, 1e-5, 1e-6));  // partial input gradients
    } else {
      EXPECT_TRUE(torch::allclose(runs[0].y + runs[1].y, want.y, 1e-5, 1e-6));  // partial sums
      EXPECT_TRUE(torch::allclose(torch::cat({runs[0].dx, runs[1].dx}, 1), want.dx, 1e-5, 1e-6));
    }
  }
}

TEST(TEGroupedLinear, InterleavedColumnShardsSplitEachBlock) {
  auto o = options();
  o.interleave = 2;  // SwiGLU: [gate; up], each split over the ranks
  auto global = TEGroupedLinear(o, factory());
  for (int r = 0; r < 2; ++r) {
    auto m = TEGroupedLinear(o, factory(nullptr, 2, r));
    auto blocks = global->weights[0].chunk(2, 0);
    auto expected = torch::cat({blocks[0].chunk(2, 0)[size_t(r)], blocks[1].chunk(2, 0)[size_t(r)]}, 0);
    EXPECT_TRUE(torch::equal(m->weights[0], expected));
    EXPECT_EQ(m->param_infos().at("weight0").interleave, 2);
  }
}

TEST(TEGroupedLinear, BadSplitsAreUserErrors) {
  auto m = TEGroupedLinear(options(), factory());
  auto x = torch::randn({10, kIn});
  EXPECT_USER_ERROR((m->forward(x, {5, 5, 0})), "m_splits has 3 token counts for 4 experts");
  EXPECT_USER_ERROR((m->forward(x, {5, 5, 0, 1})), "m_splits sum to 11 tokens but the input has 10");
  EXPECT_USER_ERROR((m->forward(x, {5, 6, -1, 0})), "expert 2 has a negative token count");
  EXPECT_USER_ERROR((m->forward(x, {5, 6, -1, 0})), kName);
}

}  // namespace
}  // namespace fp8tron
