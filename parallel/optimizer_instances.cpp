#include "parallel/optimizer_instances.h"

#include <algorithm>

#include "core/error.h"
#include "parallel/parallel_state.h"
#include "parallel/topology.h"

namespace fp8tron {

InstanceRankGroups optimizer_instance_rank_groups(const std::vector<std::vector<int>>& dp_groups, int instances) {
  FP8TRON_CHECK(instances >= 1, "at least one distributed-optimizer instance");
  InstanceRankGroups out;
  for (const auto& group : dp_groups) {
    const int size = int(group.size());
    FP8TRON_CHECK(size % instances == 0, "the data-parallel size must be divisible by the optimizer instances");
    const int per_instance = size / instances;
    for (int i = 0; i < instances; ++i)
      out.intra.emplace_back(group.begin() + i * per_instance, group.begin() + (i + 1) * per_instance);
    for (int position = 0; position < per_instance; ++position) {
      std::vector<int> counterparts;
      for (int i = 0; i < instances; ++i) counterparts.push_back(group[size_t(i * per_instance + position)]);
      out.inter.push_back(std::move(counterparts));
    }
  }
  return out;
}

OptimizerInstanceGroups build_optimizer_instance_groups(Transport* transport, const std::vector<std::vector<int>>& dp_groups,
                                                        std::shared_ptr<Communicator> whole, int instances,
                                                        const std::string& name, int world_rank) {
  if (instances == 1) return {std::move(whole), make_self_communicator(name + "-inter-instance", world_rank)};
  FP8TRON_CHECK(transport != nullptr, "distributed-optimizer instances need the job's transport");
  const InstanceRankGroups ranks = optimizer_instance_rank_groups(dp_groups, instances);
  // Singleton groups need no collective communicator (an instance of one rank holds every shard).
  auto group = [&](const std::string& suffix, const std::vector<std::vector<int>>& groups) {
    if (groups.front().size() == 1) return make_self_communicator(name + suffix, world_rank);
    return transport->new_group(name + suffix, groups);
  };
  OptimizerInstanceGroups g;
  g.intra = group("-intra-instance", ranks.intra);
  g.inter = group("-inter-instance", ranks.inter);
  return g;
}

DataParallelInstances build_data_parallel_instances(const ParallelState& p, std::shared_ptr<Communicator> dp_cp,
                                                    int instances, bool experts) {
  DataParallelInstances out;
  const auto dense_groups = dense_rank_groups(p.sizes, "cp-dp");
  out.dense = build_optimizer_instance_groups(p.transport.get(), dense_groups, std::move(dp_cp), instances, "dp-cp", p.world_rank);
  if (!experts) return out;
  const auto expert_groups = expert_rank_groups(p.sizes, "edp");
  if (instances == 1) {
    out.expert = build_optimizer_instance_groups(nullptr, expert_groups, p.expert_dp, 1, "expert-dp", p.world_rank);
    return out;
  }
  const InstanceRankGroups dense = optimizer_instance_rank_groups(dense_groups, instances);
  const InstanceRankGroups expert = optimizer_instance_rank_groups(expert_groups, instances);
  auto group = [&](const std::string& name, const std::vector<std::vector<int>>& groups,
                   const std::vector<std::vector<int>>& dense_twin, const std::shared_ptr<Communicator>& dense_comm) {
    auto sorted = [](std::vector<std::vector<int>> g) {
      std::sort(g.begin(), g.end());
      return g;
    };
    if (sorted(groups) == sorted(dense_twin)) return dense_comm;
    if (groups.front().size() == 1) return make_self_communicator(name, p.world_rank);
    return p.transport->new_group(name, groups);
  };
  out.expert.intra = group("expert-dp-intra-instance", expert.intra, dense.intra, out.dense.intra);
  out.expert.inter = group("expert-dp-inter-instance", expert.inter, dense.inter, out.dense.inter);
  return out;
}

}  // namespace fp8tron
