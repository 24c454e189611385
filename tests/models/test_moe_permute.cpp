// Token permutation (models/moe/permute.h) on the CPU: the expert-major, token-ascending row order,
// the probability-weighted combine against an explicit loop, round trips, chunk reordering, and
// gradients (fp64 finite differences). tests/models/test_gpu_moe.cpp holds the kernels to this path.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "models/moe/permute.h"

namespace fp8tron {
namespace {

// 5 tokens, 3 experts; token 4 routed nowhere, token 1 to all three.
torch::Tensor example_map() {
  return torch::tensor({{1, 0, 1}, {1, 1, 1}, {0, 1, 0}, {0, 0, 1}, {0, 0, 0}}, torch::kInt32).to(torch::kBool);
}
std::vector<int64_t> column_counts(const torch::Tensor& map) {
  auto c = map.sum(0).to(torch::kInt64);
  return std::vector<int64_t>(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
}

TEST(MoePermute, RowsAreExpertMajorThenTokenAscending) {
  const auto map = example_map();
  const auto index = moe::make_permute_index(map, column_counts(map));
  EXPECT_EQ(index.counts, (std::vector<int64_t>{2, 2, 3}));
  EXPECT_EQ(index.rows, 7);
  // Expert 0: tokens 0, 1; expert 1: tokens 1, 2; expert 2: tokens 0, 1, 3.
  auto want_rows = torch::tensor({{0, -1, 4}, {1, 2, 5}, {-1, 3, -1}, {-1, -1, 6}, {-1, -1, -1}}, torch::kInt32);
  EXPECT_TRUE(torch::equal(index.row_of, want_rows)) << index.row_of;
  auto x = torch::arange(5, torch::kFloat32).unsqueeze(1).repeat({1, 2}) * 10;
  auto y = moe::permute(x, index);
  auto want = torch::tensor({0.0f, 10.0f, 10.0f, 20.0f, 0.0f, 10.0f, 30.0f}).unsqueeze(1).repeat({1, 2});
  EXPECT_TRUE(torch::equal(y, want)) << y;
}

TEST(MoePermute, PaddingAddsEachExpertsEarliestUnroutedTokens) {
  const auto map = example_map();
  const auto index = moe::make_permute_index(map, column_counts(map), /*pad_multiple=*/2);
  // Counts 2, 2, 3 padded to multiples of 2: expert 2 also takes token 2, its earliest unrouted one.
  EXPECT_EQ(index.counts, (std::vector<int64_t>{2, 2, 4}));
  EXPECT_EQ(index.rows, 8);
  auto want_rows = torch::tensor({{0, -1, 4}, {1, 2, 5}, {-1, 3, 6}, {-1, -1, 7}, {-1, -1, -1}}, torch::kInt32);
  EXPECT_TRUE(torch::equal(index.row_of, want_rows)) << index.row_of;
  EXPECT_TRUE(torch::equal(index.flat_of_row, torch::tensor({0, 3, 4, 7, 2, 5, 8, 11}, torch::kInt64))) << index.flat_of_row;
  EXPECT_EQ(moe::padded_count(17, 16), 32);
  EXPECT_EQ(moe::padded_count(0, 16), 0);
  EXPECT_EQ(moe::padded_count(5, 0), 5);
}

TEST(MoePermute, UnpermuteIsTheProbabilityWeightedSum) {
  torch::manual_seed(1);
  const auto map = example_map();
  const auto index = moe::make_permute_index(map, column_counts(map));
  auto y = torch::randn({index.rows, 4});
  auto probs = torch::rand({5, 3}) * map;
  auto out = moe::unpermute(y, index, probs, torch::kFloat32);
  auto want = torch::zeros({5, 4});
  for (int64_t t = 0; t < 5; ++t)
    for (int64_t e = 0; e < 3; ++e) {
      const int row = index.row_of[t][e].item<int>();
      if (row >= 0) want[t] += probs[t][e] * y[row];
    }
  EXPECT_TRUE(torch::allclose(out, want, 1e-6, 1e-7));
  EXPECT_EQ(out[4].abs().sum().item<float>(), 0.0f);  // a token routed nowhere gets zeros
  // bf16 rows: the sum in fp32, rounded once.
  auto out_bf16 = moe::unpermute(y.to(torch::kBFloat16), index, probs, torch::kBFloat16);
  auto want_bf16 = moe::unpermute(y.to(torch::kBFloat16).to(torch::kFloat32), index, probs, torch::kFloat32).to(torch::kBFloat16);
  EXPECT_TRUE(torch::equal(out_bf16, want_bf16));
}

TEST(MoePermute, RoundTripWithoutProbsCountsEachTokensExperts) {
  torch::manual_seed(2);
  auto map = torch::rand({64, 8}) < 0.3;
  const auto index = moe::make_permute_index(map, column_counts(map));
  auto x = torch::randn({64, 16});
  auto back = moe::unpermute(moe::permute(x, index), index, {}, torch::kFloat32);
  auto k = map.sum(1).to(torch::kFloat32).unsqueeze(1);
  EXPECT_TRUE(torch::allclose(back, k * x, 1e-6, 1e-6));
}

TEST(MoePermute, SortChunksReordersAndItsBackwardRestores) {
  const std::vector<int64_t> sizes = {2, 0, 3, 1};
  const std::vector<int64_t> order = {2, 0, 3, 1};
  EXPECT_EQ(moe::sort_chunks_source_rows(sizes, order), (std::vector<int64_t>{2, 3, 4, 0, 1, 5}));
  auto x = torch::arange(12, torch::kFloat64).view({6, 2}).requires_grad_(true);
  auto y = moe::sort_chunks(x, sizes, order);
  auto src = torch::tensor(moe::sort_chunks_source_rows(sizes, order), torch::kInt64);
  EXPECT_TRUE(torch::equal(y, x.detach().index_select(0, src)));
  auto g = torch::randn({6, 2}, torch::kFloat64);
  y.backward(g);
  EXPECT_TRUE(torch::equal(x.grad().index_select(0, src), g));
}

// Central differences in fp64 for permute and the weighted unpermute (x, y and probs).
TEST(MoePermute, GradientsMatchFiniteDifferences) {
  torch::manual_seed(3);
  auto map = torch::rand({6, 4}, torch::kFloat64) < 0.5;
  map[0][0] = true;
  const auto index = moe::make_permute_index(map, column_counts(map));
  auto x = torch::randn({6, 3}, torch::kFloat64).requires_grad_(true);
  auto probs = (torch::rand({6, 4}, torch::kFloat64) * map).requires_grad_(true);
  auto weights = torch::randn({6, 3}, torch::kFloat64);
  auto f = [&](const torch::Tensor& xs, const torch::Tensor& ps) {
    // Experts: a different affine map per row block, so the rows matter individually.
    auto y = moe::permute(xs, index);
    y = y * (torch::arange(index.rows, torch::kFloat64).unsqueeze(1) * 0.1 + 1.0);
    return (moe::unpermute(y, index, ps, torch::kFloat64) * weights).sum();
  };
  f(x, probs).backward();
  const double h = 1e-6;
  for (int64_t i = 0; i < x.numel(); ++i) {
    auto xp = x.detach().clone(), xm = x.detach().clone();
    xp.view({-1})[i] += h;
    xm.view({-1})[i] -= h;
    const double numeric = (f(xp, probs.detach()) - f(xm, probs.detach())).item<double>() / (2 * h);
    EXPECT_NEAR(x.grad().view({-1})[i].item<double>(), numeric, 1e-6) << "x " << i;
  }
  for (int64_t i = 0; i < probs.numel(); ++i) {
    if (!map.view({-1})[i].item<bool>()) continue;
    auto pp = probs.detach().clone(), pm = probs.detach().clone();
    pp.view({-1})[i] += h;
    pm.view({-1})[i] -= h;
    const double numeric = (f(x.detach(), pp) - f(x.detach(), pm)).item<double>() / (2 * h);
    EXPECT_NEAR(probs.grad().view({-1})[i].item<double>(), numeric, 1e-6) << "probs " << i;
  }
}

}  // namespace
}  // namespace fp8tron
