#include "parallel/topology.h"

#include <algorithm>
#include <sstream>

#include "core/error.h"
#include "core/text.h"

namespace fp8tron {
namespace {
std::vector<std::string> split_dashes(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, '-');) out.push_back(item);
  return out;
}
}  // namespace

ParallelSizes ParallelSizes::derive(int world_size, int tp, int cp, int pp, int ep, int etp, bool tp_pp_dp_order) {
  ParallelSizes s;
  s.world_size = world_size;
  s.tp = tp; s.cp = cp; s.pp = pp; s.ep = ep; s.etp = etp;
  s.tp_pp_dp_order = tp_pp_dp_order;
  for (auto [v, flag] : {std::pair{tp, "--tensor-model-parallel-size"}, {cp, "--context-parallel-size"},
                         {pp, "--pipeline-model-parallel-size"}, {ep, "--expert-model-parallel-size"},
                         {etp, "--expert-tensor-parallel-size"}})
    if (v < 1) throw UserError(std::string(flag) + " must be at least 1");
  const int model = tp * cp * pp;
  if (world_size % model != 0)
    throw UserError(strprintf("world size %d is not divisible by --tensor-model-parallel-size (%d) x "
                              "--context-parallel-size (%d) x --pipeline-model-parallel-size (%d) = %d",
                              world_size, tp, cp, pp, model));
  s.dp = world_size / model;
  const int expert_model = etp * ep * pp;
  if (world_size % expert_model != 0)
    throw UserError(strprintf("world size %d is not divisible by --expert-tensor-parallel-size (%d) x "
                              "--expert-model-parallel-size (%d) x --pipeline-model-parallel-size (%d)",
                              world_size, etp, ep, pp));
  s.edp = world_size / expert_model;
  return s;
}

std::string ParallelSizes::order() const { return tp_pp_dp_order ? "tp-cp-ep-pp-dp" : "tp-cp-ep-dp-pp"; }

std::string ParallelSizes::describe() const {
  return strprintf("world %d = TP %d x CP %d x DP %d x PP %d (order %s) | experts: ETP %d x EP %d x EDP %d x PP %d",
                   world_size, tp, cp, dp, pp, order().c_str(), etp, ep, edp, pp);
}

std::vector<std::vector<int>> orthogonal_rank_groups(const std::vector<std::pair<std::string, int>>& dims,
                                                     const std::string& token) {
  const auto names = split_dashes(token);
  for (const auto& n : names) {
    bool known = std::any_of(dims.begin(), dims.end(), [&](const auto& d) { return d.first == n; });
    FP8TRON_CHECK(known, "unknown parallel dimension '" + n + "' in '" + token + "'");
  }
  std::vector<int> stride(dims.size());
  int world = 1;
  for (size_t i = 0; i < dims.size(); ++i) { stride[i] = world; world *= dims[i].second; }

  std::vector<size_t> varying, fixed;
  for (size_t i = 0; i < dims.size(); ++i)
    (std::find(names.begin(), names.end(), dims[i].first) != names.end() ? varying : fixed).push_back(i);

  auto count = [&](const std::vector<size_t>& idx) {
    int n = 1;
    for (size_t i : idx) n *= dims[i].second;
    return n;
  };
  // Decodes a mixed-radix index over `idx` dimensions (first fastest) into a rank offset.
  auto offset = [&](const std::vector<size_t>& idx, int linear) {
    int rank = 0;
    for (size_t i : idx) { rank += (linear % dims[i].second) * stride[i]; linear /= dims[i].second; }
    return rank;
  };
  std::vector<std::vector<int>> groups;
  for (int g = 0; g < count(fixed); ++g) {
    std::vector<int> group;
    for (int m = 0; m < count(varying); ++m) group.push_back(offset(fixed, g) + offset(varying, m));
    groups.push_back(std::move(group));
  }
  return groups;
}

GroupMembership membership_of(const std::vector<std::vector<int>>& groups, int rank, const std::string& group_name) {
  for (size_t g = 0; g < groups.size(); ++g)
    for (size_t i = 0; i < groups[g].size(); ++i)
      if (groups[g][i] == rank) return GroupMembership{int(g), int(i), groups[g]};
  FP8TRON_CHECK(false, "rank " + std::to_string(rank) + " is in no '" + group_name + "' group");
  return {};
}

std::vector<std::vector<int>> dense_rank_groups(const ParallelSizes& s, const std::string& token) {
  // The dense grid has no expert dimension (ep = 1 there), as Megatron's decoder RankGenerator.
  std::vector<std::pair<std::string, int>> dims = {{"tp", s.tp}, {"cp", s.cp}};
  if (s.tp_pp_dp_order) { dims.push_back({"pp", s.pp}); dims.push_back({"dp", s.dp}); }
  else { dims.push_back({"dp", s.dp}); dims.push_back({"pp", s.pp}); }
  return orthogonal_rank_groups(dims, token);
}

std::vector<std::vector<int>> expert_rank_groups(const ParallelSizes& s, const std::string& token) {
  std::vector<std::pair<std::string, int>> dims = {{"etp", s.etp}, {"ep", s.ep}};
  if (s.tp_pp_dp_order) { dims.push_back({"pp", s.pp}); dims.push_back({"edp", s.edp}); }
  else { dims.push_back({"edp", s.edp}); dims.push_back({"pp", s.pp}); }
  return orthogonal_rank_groups(dims, token);
}

}  // namespace fp8tron
