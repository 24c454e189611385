// The rank grid: which global ranks form each tensor-, context-, expert-, data- and
// pipeline-parallel group. A pure function of the sizes and an order string, as Megatron's
// RankGenerator: the first dimension of the order varies fastest across consecutive ranks.
#pragma once
#include <string>
#include <vector>

#include "core/config/parallel_config.h"

namespace fp8tron {

// Groups for `token` ("tp", "dp", "tp-pp", "cp-dp", ...) in the dense (attention/MLP) grid.
// Each group lists global ranks, ordered by the token's dimensions (first fastest).
std::vector<std::vector<int>> dense_rank_groups(const ParallelSizes& sizes, const std::string& token);
// Groups for the expert grid (dims etp, ep, edp, pp).
std::vector<std::vector<int>> expert_rank_groups(const ParallelSizes& sizes, const std::string& token);

// Where `rank` sits in a partition of the world into groups: the group's index (the colour of
// MPI_Comm_split / ncclCommSplit), the rank's position in it (the key) and the members.
struct GroupMembership {
  int color = -1;
  int key = 0;
  std::vector<int> members;
};
GroupMembership membership_of(const std::vector<std::vector<int>>& groups, int rank, const std::string& group_name);

// Generic form: dims are (name, size) in order, first fastest; `token` names the varying dims.
std::vector<std::vector<int>> orthogonal_rank_groups(const std::vector<std::pair<std::string, int>>& dims,
                                                     const std::string& token);

}  // namespace fp8tron
