// The optimizer's flat-buffer layout (optim/buffer_layout.h): elementwise-updated
// parameters back to back from 0, Muon's matrices each inside one data-parallel rank's shard
// (Megatron's layer-wise distributed optimizer), balanced by Newton-Schulz cost.
#include <gtest/gtest.h>

#include <algorithm>

#include "optim/buffer_layout.h"

namespace fp8tron {
namespace {

// Every parameter inside [0, ranks x shard), none overlapping, whole ones inside one shard.
void expect_valid(const std::vector<LayoutParam>& params, const BufferLayout& l, int ranks) {
  ASSERT_EQ(l.offsets.size(), params.size());
  std::vector<std::pair<int64_t, int64_t>> spans;
  int64_t end = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    const int64_t lo = l.offsets[i], hi = lo + params[i].numel;
    EXPECT_GE(lo, 0);
    EXPECT_LE(hi, l.shard_numel * ranks) << i;
    if (params[i].whole && ranks > 1 && params[i].numel > 0)
      EXPECT_EQ(lo / l.shard_numel, (hi - 1) / l.shard_numel) << "parameter " << i << " crosses a shard";
    spans.emplace_back(lo, hi);
    end = std::max(end, hi);
  }
  EXPECT_EQ(l.numel, end);
  std::sort(spans.begin(), spans.end());
  for (size_t i = 1; i < spans.size(); ++i) EXPECT_LE(spans[i - 1].second, spans[i].first) << "overlap";
}

TEST(BufferLayout, ElementwiseParametersLieBackToBack) {
  const std::vector<LayoutParam> p = {{10, false, 10}, {7, false, 7}, {5, false, 5}};
  const BufferLayout l = plan_buffer_layout(p, 4);
  EXPECT_EQ(l.offsets, (std::vector<int64_t>{0, 10, 17}));
  EXPECT_EQ(l.numel, 22);
  EXPECT_EQ(l.shard_numel, 6);  // ceil(22 / 4), as the plain distributed optimizer pads
}

TEST(BufferLayout, WholeParametersStayInOneShardAndBalance) {
  // Adam's 1-D parameters first, then four equal matrices over two ranks: two each.
  std::vector<LayoutParam> p = {{30, false, 30}, {8, false, 8}};
  for (int i = 0; i < 4; ++i) p.push_back({64, true, newton_schulz_cost(8, 8)});
  const BufferLayout l = plan_buffer_layout(p, 2);
  expect_valid(p, l, 2);
  EXPECT_EQ(l.offsets[0], 0);
  EXPECT_EQ(l.offsets[1], 30);
  int on_rank0 = 0;
  for (size_t i = 2; i < p.size(); ++i) on_rank0 += l.offsets[i] < l.shard_numel ? 1 : 0;
  EXPECT_EQ(on_rank0, 2);
  // The same sizes give the same layout (every rank computes it on its own).
  EXPECT_EQ(plan_buffer_layout(p, 2).offsets, l.offsets);
}

TEST(BufferLayout, ShardsGrowUntilTheLargestMatrixFits) {
  const std::vector<LayoutParam> p = {{4, false, 4}, {100, true, newton_schulz_cost(10, 10)}, {9, true, newton_schulz_cost(3, 3)},
                                      {9, true, newton_schulz_cost(3, 3)}};
  for (int ranks : {2, 3, 4, 8}) {
    const BufferLayout l = plan_buffer_layout(p, ranks);
    expect_valid(p, l, ranks);
    EXPECT_GE(l.shard_numel, 100);
  }
  // One rank: no shards to respect, everything back to back.
  const BufferLayout one = plan_buffer_layout(p, 1);
  EXPECT_EQ(one.offsets, (std::vector<int64_t>{0, 4, 104, 113}));
  EXPECT_EQ(one.shard_numel, 122);
}

TEST(BufferLayout, ExpensiveMatricesSpreadOverTheRanks) {
  // Two large and many small matrices over two ranks: the large ones go to different ranks.
  std::vector<LayoutParam> p = {{1024, true, newton_schulz_cost(32, 32)}};
  for (int i = 0; i < 8; ++i) p.push_back({16, true, newton_schulz_cost(4, 4)});
  p.push_back({1024, true, newton_schulz_cost(32, 32)});
  const BufferLayout l = plan_buffer_layout(p, 2);
  expect_valid(p, l, 2);
  EXPECT_NE(l.offsets.front() / l.shard_numel, l.offsets.back() / l.shard_numel);
}

}  // namespace
}  // namespace fp8tron
