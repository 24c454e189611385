// The rank grid: which global ranks form each tensor-, context-, expert-, data- and
// pipeline-parallel group. A pure function of the sizes and an order string, as Megatron's
// RankGenerator: the first dimension of the order varies fastest across consecutive ranks.
#pragma once
#include <string>
#include <vector>

namespace fp8tron {

struct ParallelSizes {
  int world_size = 1;
  int tp = 1;   // tensor model parallel
  int cp = 1;   // context parallel
  int pp = 1;   // pipeline model parallel
  int ep = 1;   // expert model parallel
  int etp = 1;  // expert tensor parallel
  int dp = 1;   // data parallel (derived: world / (tp * cp * pp))
  int edp = 1;  // expert data parallel (derived: world / (etp * ep * pp))
  bool tp_pp_dp_order = false;  // --use-tp-pp-dp-mapping

  // Fills dp and edp from world_size; throws UserError naming the flags when sizes do not divide.
  static ParallelSizes derive(int world_size, int tp, int cp, int pp, int ep, int etp, bool tp_pp_dp_order);
  std::string order() const;         // "tp-cp-ep-dp-pp" or "tp-cp-ep-pp-dp"
  std::string describe() const;      // one line: "TP=2 CP=1 PP=2 DP=4 | experts: ETP=2 EP=1 EDP=8"
};

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
