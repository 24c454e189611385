// Megatron's partial distributed optimizer (--num-distributed-optimizer-instances N): the ranks of
// each data-parallel group (data x context parallel for the dense weights, expert data parallel
// for the routed experts) form N consecutive blocks, the instances. Each instance holds a whole
// copy of the optimizer state, sharded over its own ranks, so the parameter all-gather and most of
// the gradient traffic stay inside an instance (a node, typically); only the reduce-scattered
// shards cross instances, in an all-reduce among the ranks that own the same shard.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "parallel/communicator.h"
#include "parallel/parallel_state.h"

namespace fp8tron {

// The groups of one data-parallel domain split into instances.
struct OptimizerInstanceGroups {
  std::shared_ptr<Communicator> intra;  // this rank's instance: the optimizer state is sharded over it
  std::shared_ptr<Communicator> inter;  // the ranks holding this rank's shard in the other instances
};

// Rank lists of the split: `intra` cuts every group of `dp_groups` into `instances` consecutive
// blocks (Megatron's intra-partial groups); `inter` joins the i-th member of every block of a group
// (its inter-partial groups). Each partitions the ranks of `dp_groups`.
struct InstanceRankGroups {
  std::vector<std::vector<int>> intra, inter;
};
InstanceRankGroups optimizer_instance_rank_groups(const std::vector<std::vector<int>>& dp_groups, int instances);

// Builds the split of `dp_groups` (every rank calls it with the same arguments; collective).
// `whole` is this rank's group of `dp_groups`: with one instance it is the intra group and the
// inter group is this rank alone, and nothing is created.
OptimizerInstanceGroups build_optimizer_instance_groups(Transport* transport, const std::vector<std::vector<int>>& dp_groups,
                                                        std::shared_ptr<Communicator> whole, int instances,
                                                        const std::string& name, int world_rank);

// Both domains' splits: the dense weights' data x context-parallel group `dp_cp` and, with
// `experts`, the expert data-parallel group. Megatron requires both sizes to be divisible by
// `instances`; where the two cross-instance splits list the same ranks they share a communicator
// (Megatron builds one inter-instance group for both).
struct DataParallelInstances {
  OptimizerInstanceGroups dense, expert;
};
DataParallelInstances build_data_parallel_instances(const ParallelState& parallel, std::shared_ptr<Communicator> dp_cp,
                                                    int instances, bool experts);

}  // namespace fp8tron
