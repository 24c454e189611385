#include <gtest/gtest.h>

#include <algorithm>

#include "core/error.h"
#include "parallel/topology.h"
#include "tests/test_helpers.h"

namespace fp8tron {

using Groups = std::vector<std::vector<int>>;

// Megatron's documented example: 16 GPUs, TP 2, PP 4 -> DP 2, order tp-cp-ep-dp-pp.
TEST(Topology, MegatronExample) {
  auto s = ParallelSizes::derive(16, 2, 1, 4, 1, 2, false);
  EXPECT_EQ(s.dp, 2);
  EXPECT_EQ(dense_rank_groups(s, "tp"), (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}, {8, 9}, {10, 11}, {12, 13}, {14, 15}}));
  EXPECT_EQ(dense_rank_groups(s, "dp"), (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}, {8, 10}, {9, 11}, {12, 14}, {13, 15}}));
  EXPECT_EQ(dense_rank_groups(s, "pp"), (Groups{{0, 4, 8, 12}, {1, 5, 9, 13}, {2, 6, 10, 14}, {3, 7, 11, 15}}));
  EXPECT_EQ(dense_rank_groups(s, "tp-pp").size(), 2u);
  EXPECT_EQ(dense_rank_groups(s, "tp-pp")[0], (std::vector<int>{0, 1, 4, 5, 8, 9, 12, 13}));
}

TEST(Topology, TpPpDpOrder) {
  auto s = ParallelSizes::derive(8, 2, 1, 2, 1, 2, true);
  EXPECT_EQ(dense_rank_groups(s, "pp"), (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(dense_rank_groups(s, "dp"), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
}

TEST(Topology, EveryRankInExactlyOneGroup) {
  auto s = ParallelSizes::derive(24, 2, 1, 3, 2, 1, false);
  for (const char* token : {"tp", "dp", "pp", "tp-dp", "cp"}) {
    std::vector<int> seen(24, 0);
    for (const auto& g : dense_rank_groups(s, token))
      for (int r : g) ++seen[size_t(r)];
    for (int n : seen) EXPECT_EQ(n, 1) << token;
  }
  std::vector<int> seen(24, 0);
  for (const auto& g : expert_rank_groups(s, "ep"))
    for (int r : g) ++seen[size_t(r)];
  for (int n : seen) EXPECT_EQ(n, 1);
  EXPECT_EQ(s.edp, 4);
}

// Megatron-Core carves the expert grid from the tp x cp x dp ranks of each pipeline stage: with
// context parallelism the expert groups span context-parallel ranks. Megatron's test layout
// gpt3_mcore_tp2_cp2_pp2_ep2 (expert TP = TP = 2): the expert-parallel groups are the
// context-parallel ones, expert TP x EP is TP x CP. CP 2 x DP 4 at EP 4: each expert-parallel group
// takes both context-parallel ranks of two data-parallel replicas.
TEST(Topology, ExpertGridSpansContextParallelRanks) {
  auto s = ParallelSizes::derive(8, 2, 2, 2, 2, 2, false);
  EXPECT_EQ(s.dp, 1);
  EXPECT_EQ(s.edp, 1);
  EXPECT_EQ(expert_rank_groups(s, "ep"), (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(expert_rank_groups(s, "ep"), dense_rank_groups(s, "cp"));
  EXPECT_EQ(expert_rank_groups(s, "etp-ep"), dense_rank_groups(s, "tp-cp"));
  EXPECT_EQ(expert_rank_groups(s, "etp"), dense_rank_groups(s, "tp"));

  auto w = ParallelSizes::derive(8, 1, 2, 1, 4, 1, false);
  EXPECT_EQ(w.dp, 4);
  EXPECT_EQ(w.edp, 2);
  EXPECT_EQ(expert_rank_groups(w, "ep"), (Groups{{0, 1, 2, 3}, {4, 5, 6, 7}}));
  EXPECT_EQ(expert_rank_groups(w, "edp"), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(dense_rank_groups(w, "cp"), (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  // Every expert group stays inside one stage's tp x cp x dp ranks.
  for (const auto& sizes : {s, w, ParallelSizes::derive(16, 2, 2, 2, 4, 1, false)}) {
    const auto stages = dense_rank_groups(sizes, "tp-cp-dp");
    for (const char* token : {"ep", "etp-ep", "edp"})
      for (const auto& g : expert_rank_groups(sizes, token)) {
        const auto in = [&](const std::vector<int>& stage) {
          return std::all_of(g.begin(), g.end(), [&](int r) { return std::count(stage.begin(), stage.end(), r) == 1; });
        };
        EXPECT_TRUE(std::any_of(stages.begin(), stages.end(), in)) << token;
      }
  }
}

TEST(Topology, IndivisibleSizesNameTheFlags) {
  EXPECT_USER_ERROR(ParallelSizes::derive(6, 4, 1, 1, 1, 4, false), "--tensor-model-parallel-size (4)");
  EXPECT_USER_ERROR(ParallelSizes::derive(8, 2, 1, 1, 3, 2, false), "--expert-model-parallel-size (3)");
  EXPECT_USER_ERROR(ParallelSizes::derive(8, 0, 1, 1, 1, 1, false), "must be at least 1");
}

}  // namespace fp8tron
