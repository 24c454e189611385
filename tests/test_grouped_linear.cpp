// TEGroupedLinear (models/grouped_linear.h) on the CPU: the bf16 path against per-expert F::linear,
// the FP8 path against per-expert fp8_linear with separate sites (bitwise), the bf16 fallbacks
// (--no-use-gmm-fp8, blockwise), tensor-parallel shards and partial sums, and bad token splits.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "fp8/fp8_linear.h"
#include "models/grouped_linear.h"
#include "parallel/parallel_state.h"
#include "test_helpers.h"

namespace fp8tron {
namespace {

constexpr int64_t kIn = 32, kOut = 48, kExperts = 4;
constexpr uint64_t kSeed = 1234;
const std::string kName = "decoder.layers.1.mlp.experts.linear_fc1";

ModuleFactory factory(std::shared_ptr<fp8::Fp8Engine> engine = nullptr, int tp_size = 1, int tp_rank = 0) {
  TensorParallelContext tp{make_self_communicator("tp", tp_rank), tp_rank, tp_size, false};
  return ModuleFactory(kSeed, tp, std::move(engine));
}

std::shared_ptr<fp8::Fp8Engine> cpu_engine(fp8::RecipeKind kind) {
  fp8::Fp8EngineOptions o;
  o.recipe = fp8::make_recipe(kind, kind == fp8::RecipeKind::kBlockwise ? fp8::Fp8Format::kE4M3 : fp8::Fp8Format::kHybrid);
  o.num_layers = 4;
  return std::make_shared<fp8::Fp8Engine>(o, torch::Device(torch::kCPU));
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

TEST(TEGroupedLinear, Fp8PathIsPerExpertFp8LinearWithSeparateSites) {
  for (auto kind : {fp8::RecipeKind::kTensorwise, fp8::RecipeKind::kDelayed}) {
    SCOPED_TRACE(fp8::recipe_kind_name(kind));
    auto engine = cpu_engine(kind);
    auto m = TEGroupedLinear(options(), factory(engine));
    randomize_biases(m, 3);
    ASSERT_EQ(m->fp8_sites.size(), size_t(kExperts));
    ASSERT_EQ(engine->num_sites(), size_t(kExperts));
    for (int64_t i = 0; i < kExperts; ++i) {
      ASSERT_TRUE(m->fp8_sites[size_t(i)]);
      EXPECT_EQ(m->fp8_sites[size_t(i)]->name, kName + ".weight" + std::to_string(i));
      EXPECT_TRUE(m->fp8_sites[size_t(i)]->parameter.is_same(m->weights[size_t(i)]));
    }

    auto reference_engine = cpu_engine(kind);
    std::vector<std::shared_ptr<fp8::Fp8Site>> sites;
    for (int64_t i = 0; i < kExperts; ++i)
      sites.push_back(reference_engine->add_site(kName + ".weight" + std::to_string(i), 1, kOut, kIn));

    const std::vector<int64_t> splits = {16, 0, 32, 16};
    torch::manual_seed(4);
    auto x = torch::randn({total(splits), kIn});
    auto dy = torch::randn({total(splits), kOut}) * 1e-2;
    const Result got = run_module(m, x, splits, dy);
    const Result want = run_reference(m, x, splits, dy, [&](size_t i, const torch::Tensor& xi, const torch::Tensor& w,
                                                         const torch::Tensor& b) { return fp8::fp8_linear(xi, w, b, *sites[i]); });
    expect_equal(got, want);
    EXPECT_EQ(got.dw[1].abs().max().item<float>(), 0.0f);
    // And it is FP8: not the exact product.
    auto exact = torch::nn::functional::linear(x.narrow(0, 0, 16), m->weights[0].detach(), m->biases[0].detach());
    EXPECT_FALSE(torch::equal(got.y.narrow(0, 0, 16), exact));
  }
}

TEST(TEGroupedLinear, Fp8RefusesTokenCountsThatAreNotMultiplesOf16) {
  auto m = TEGroupedLinear(options(), factory(cpu_engine(fp8::RecipeKind::kTensorwise)));
  auto x = torch::randn({16 + 0 + 20 + 12, kIn});
  EXPECT_USER_ERROR((m->forward(x, {16, 0, 20, 12})), "expert 2 received 20 tokens, not a multiple of 16");
  EXPECT_USER_ERROR((m->forward(x, {16, 0, 20, 12})), "--moe-router-padding-for-fp8");
}

TEST(TEGroupedLinear, NoGmmFp8AndBlockwiseRunTheBf16Gemms) {
  const std::vector<int64_t> splits = {5, 0, 11, 8};  // bf16 takes any token count
  torch::manual_seed(5);
  auto x = torch::randn({total(splits), kIn});
  auto dy = torch::randn({total(splits), kOut});
  auto plain = TEGroupedLinear(options(), factory());
  randomize_biases(plain, 6);
  const Result want = run_module(plain, x, splits, dy);

  auto engine = cpu_engine(fp8::RecipeKind::kTensorwise);
  auto o = options();
  o.use_fp8 = false;
  auto no_gmm_fp8 = TEGroupedLinear(o, factory(engine));
  EXPECT_TRUE(no_gmm_fp8->fp8_sites.empty());
  EXPECT_EQ(engine->num_sites(), 0u);
  randomize_biases(no_gmm_fp8, 6);
  expect_equal(run_module(no_gmm_fp8, x, splits, dy), want);

  auto blockwise_engine = cpu_engine(fp8::RecipeKind::kBlockwise);
  ::testing::internal::CaptureStderr();
  auto blockwise = TEGroupedLinear(options(), factory(blockwise_engine));
  auto second = TEGroupedLinear(options(), factory(blockwise_engine));  // the notice is printed once
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_TRUE(blockwise->fp8_sites.empty());
  EXPECT_EQ(blockwise_engine->num_sites(), 0u);
  const std::string notice = fp8::grouped_gemm_notice(blockwise_engine->recipe());
  EXPECT_FALSE(notice.empty());
  const size_t at = log.find(notice);
  EXPECT_NE(at, std::string::npos) << log;
  if (at != std::string::npos) EXPECT_EQ(log.find(notice, at + 1), std::string::npos) << log;
  randomize_biases(blockwise, 6);
  expect_equal(run_module(blockwise, x, splits, dy), want);
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
