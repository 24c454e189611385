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
