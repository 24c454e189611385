// The rank groups of Megatron's partial distributed optimizer (--num-distributed-optimizer-instances):
// instances are consecutive blocks of each data-parallel group, the cross-instance groups join the
// ranks owning the same shard, and the dense and expert splits agree on the cross-instance groups.
#include <gtest/gtest.h>

#include <algorithm>

#include "parallel/optimizer_instances.h"
#include "parallel/topology.h"

namespace fp8tron {
namespace {

using Groups = std::vector<std::vector<int>>;

Groups sorted(Groups g) {
  std::sort(g.begin(), g.end());
  return g;
}

TEST(OptimizerInstances, ConsecutiveBlocksOfTheDataParallelGroup) {
  const auto dp4 = ParallelSizes::derive(4, 1, 1, 1, 1, 1, false);
  const InstanceRankGroups g = optimizer_instance_rank_groups(dense_rank_groups(dp4, "cp-dp"), 2);
  EXPECT_EQ(g.intra, (Groups{{0, 1}, {2, 3}}));
  EXPECT_EQ(g.inter, (Groups{{0, 2}, {1, 3}}));
  // One instance: the data-parallel groups themselves, nobody to all-reduce with.
  const InstanceRankGroups one = optimizer_instance_rank_groups(dense_rank_groups(dp4, "cp-dp"), 1);
  EXPECT_EQ(one.intra, (Groups{{0, 1, 2, 3}}));
  EXPECT_EQ(one.inter, (Groups{{0}, {1}, {2}, {3}}));
  // As many instances as ranks: each rank holds a whole copy.
  EXPECT_EQ(optimizer_instance_rank_groups(dense_rank_groups(dp4, "cp-dp"), 4).inter, (Groups{{0, 1, 2, 3}}));
}

TEST(OptimizerInstances, SplitEveryTensorParallelRanksGroup) {
  // TP2 x DP4: the data-parallel groups are {0,2,4,6} and {1,3,5,7}.
  const auto s = ParallelSizes::derive(8, 2, 1, 1, 1, 2, false);
  const InstanceRankGroups g = optimizer_instance_rank_groups(dense_rank_groups(s, "cp-dp"), 2);
  EXPECT_EQ(g.intra, (Groups{{0, 2}, {4, 6}, {1, 3}, {5, 7}}));
  EXPECT_EQ(g.inter, (Groups{{0, 4}, {2, 6}, {1, 5}, {3, 7}}));
}

TEST(OptimizerInstances, ContextParallelRanksShareTheInstance) {
  // CP2 x DP2, N = 2: Megatron cuts the data x context-parallel group (cp varies fastest), so an
  // instance is one data-parallel rank's context-parallel pair.
  const auto s = ParallelSizes::derive(4, 1, 2, 1, 1, 1, false);
  const InstanceRankGroups g = optimizer_instance_rank_groups(dense_rank_groups(s, "cp-dp"), 2);
  EXPECT_EQ(g.intra, (Groups{{0, 1}, {2, 3}}));
  EXPECT_EQ(g.inter, (Groups{{0, 2}, {1, 3}}));
}

TEST(OptimizerInstances, DenseAndExpertSplitsShareTheCrossInstanceGroups) {
  // Megatron builds one inter-instance group for attention, MLP and experts: with DP8 x EP2 the
  // expert data-parallel groups {0,2,4,6}, {1,3,5,7} split into the same pairs as the dense {0..7}.
  const auto s = ParallelSizes::derive(8, 1, 1, 1, 2, 1, false);
  const InstanceRankGroups dense = optimizer_instance_rank_groups(dense_rank_groups(s, "cp-dp"), 2);
  const InstanceRankGroups experts = optimizer_instance_rank_groups(expert_rank_groups(s, "edp"), 2);
  EXPECT_EQ(sorted(dense.inter), sorted(experts.inter));
  EXPECT_EQ(dense.intra, (Groups{{0, 1, 2, 3}, {4, 5, 6, 7}}));
  EXPECT_EQ(experts.intra, (Groups{{0, 2}, {4, 6}, {1, 3}, {5, 7}}));
}

TEST(OptimizerInstances, IndivisibleSizesAreRefused) {
  const auto dp6 = ParallelSizes::derive(6, 1, 1, 1, 1, 1, false);
  EXPECT_THROW(optimizer_instance_rank_groups(dense_rank_groups(dp6, "cp-dp"), 4), std::exception);
}

}  // namespace
}  // namespace fp8tron
