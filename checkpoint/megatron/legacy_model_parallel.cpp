#include "checkpoint/megatron/legacy_model_parallel.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <regex>
#include <set>
#include <tuple>

#include "checkpoint/megatron/tensor_parallel_split.h"
#include "core/error.h"
#include "core/text.h"

namespace fp8tron::checkpoint::megatron {
namespace fs = std::filesystem;
namespace {

// A routed expert's tensor in fp8tron's names, behind any prefix: ...mlp.experts.linear_fc<k>.weight<e>
// (or .bias<e>); group 1 is the name up to the expert index, group 2 the index.
const std::regex& routed_expert_name() {
  static const std::regex kExpert(R"(^(.*\.mlp\.experts\.linear_fc[12]\.(?:weight|bias))(\d+)$)");
  return kExpert;
}

// "decoder.layers.<i>.rest" (optionally behind an optimizer prefix) with i moved by `offset`.
std::string shift_layer(const std::string& name, int64_t offset, int64_t& local_layer) {
  static const std::regex kLayer(R"(^(.*decoder\.layers\.)(\d+)(\..*)$)");
  std::smatch m;
  local_layer = -1;
  if (!std::regex_match(name, m, kLayer)) return name;
  local_layer = std::stoll(m[2].str());
  return m[1].str() + std::to_string(local_layer + offset) + m[3].str();
}

}  // namespace

std::vector<LegacyRankFile> legacy_rank_files(const std::string& dir, const LegacyLayout& saved) {
  static const std::regex kRank(R"(^mp_rank_(\d\d)(?:_(\d\d\d))?(?:_(\d\d\d))?$)");
  std::vector<LegacyRankFile> files;
  std::set<std::tuple<int, int, int>> seen;
  const bool expert_names = saved.expert_parallel > 1;
  int tp = int(saved.tensor_parallel), pp = int(saved.pipeline_parallel), ep = int(saved.expert_parallel);
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string base = e.path().filename().string();
    std::smatch m;
    if (!std::regex_match(base, m, kRank)) continue;
    LegacyRankFile f{e.path().string() + "/model_optim_rng.pt", std::stoi(m[1].str())};
    if (m[3].matched) f.pp_rank = std::stoi(m[2].str()), f.ep_rank = std::stoi(m[3].str());
    else if (m[2].matched) (expert_names ? f.ep_rank : f.pp_rank) = std::stoi(m[2].str());
    tp = std::max(tp, f.tp_rank + 1), pp = std::max(pp, f.pp_rank + 1), ep = std::max(ep, f.ep_rank + 1);
    seen.insert({f.tp_rank, f.pp_rank, f.ep_rank});
    files.push_back(f);
  }
  if (files.empty()) throw UserError("checkpoint " + dir + " holds no mp_rank_* directory");
  const int64_t expert_tp = saved.expert_tensor_parallel > 0 ? saved.expert_tensor_parallel : tp;
  if (tp > 1 && ep > 1 && expert_tp != tp && expert_tp != 1)
    throw UserError(strprintf("checkpoint %s was saved with --expert-tensor-parallel-size %lld and "
                              "--tensor-model-parallel-size %d; fp8tron reads Megatron torch checkpoints of expert- and "
                              "tensor-parallel ranks whose experts are split as the dense layers (the same sizes) or "
                              "whole (1): save with --ckpt-format torch_dist",
                              dir.c_str(), (long long)expert_tp, tp));
  const auto stage_name = [&](int p) { return pp > 1 ? strprintf("_%03d", p) : std::string(); };
  if (tp > 1 && ep > 1 && expert_tp == 1) {
    // Whole experts: each tensor-parallel rank's dense part and each expert-parallel rank's experts
    // must be in some file of the stage (Megatron writes only some (tp, ep) pairs).
    for (int p = 0; p < pp; ++p)
      for (int rank = 0; rank < std::max(tp, ep); ++rank) {
        bool dense = rank >= tp, experts = rank >= ep;
        for (const auto& [ft, fp, fx] : seen) dense |= fp == p && ft == rank, experts |= fp == p && fx == rank;
        if (!dense || !experts)
          throw UserError(strprintf("checkpoint %s lacks a directory holding %s %d's part of pipeline stage %d "
                                    "(mp_rank_%s): copy the whole checkpoint",
                                    dir.c_str(), dense ? "expert-parallel rank" : "tensor-parallel rank", rank, p,
                                    dense ? ("TT" + stage_name(p) + strprintf("_%03d", rank)).c_str()
                                          : (strprintf("%02d", rank) + stage_name(p) + "_EEE").c_str()));
      }
  } else {
    for (int p = 0; p < pp; ++p)
      for (int t = 0; t < tp; ++t)
        for (int x = 0; x < ep; ++x)
          if (!seen.count({t, p, x}))
            throw UserError(strprintf("checkpoint %s lacks the directory of tensor-parallel rank %d, pipeline stage %d%s "
                                      "(mp_rank_%02d%s%s): copy the whole checkpoint",
                                      dir.c_str(), t, p, ep > 1 ? strprintf(", expert-parallel rank %d", x).c_str() : "",
                                      t, stage_name(p).c_str(), ep > 1 ? strprintf("_%03d", x).c_str() : ""));
  }
  std::sort(files.begin(), files.end(), [](const LegacyRankFile& a, const LegacyRankFile& b) {
    return std::tie(a.pp_rank, a.tp_rank, a.ep_rank) < std::tie(b.pp_rank, b.tp_rank, b.ep_rank);
  });
  return files;
}

bool experts_whole_on_tensor_ranks(const LegacyLayout& saved) {
  return saved.tensor_parallel > 1 && saved.expert_parallel > 1 && saved.expert_tensor_parallel == 1;
}

bool is_routed_expert_tensor(const std::string& name) {
  return std::regex_match(name, routed_expert_name());
}

std::string first_legacy_rank_file(const std::string& dir) {
  std::string first;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string base = e.path().filename().string();
    if (base.starts_with("mp_rank_") && (first.empty() || base < first)) first = base;
  }
  if (first.empty()) throw UserError("checkpoint " + dir + " holds no mp_rank_* directory");
  return dir + "/" + first + "/model_optim_rng.pt";
}

MegatronCheckpoint merge_expert_ranks(std::vector<MegatronCheckpoint> parts, int64_t num_experts) {
  const int64_t ranks = int64_t(parts.size());
  if (num_experts <= 0 || num_experts % ranks != 0)
    throw UserError(strprintf("%s: %lld experts cannot be split over the checkpoint's %lld expert-parallel ranks",
                              parts.front().path.c_str(), (long long)num_experts, (long long)ranks));
  const int64_t local = num_experts / ranks;
  MegatronCheckpoint out = parts.front();
  out.tensors.clear();
  for (int64_t rank = 0; rank < ranks; ++rank) {
    const MegatronCheckpoint& part = parts[size_t(rank)];
    if (part.iteration != out.iteration)
      throw UserError(part.path + " was saved at iteration " + std::to_string(part.iteration) + ", " +
                      parts.front().path + " at " + std::to_string(out.iteration));
    if (out.optimizer_refusal.empty()) out.optimizer_refusal = part.optimizer_refusal;
    for (const auto& [name, t] : part.tensors) {
      std::smatch m;
      if (!std::regex_match(name, m, routed_expert_name())) {  // fp8tron's name of a local expert
        if (rank == 0) out.tensors.emplace(name, t);  // dense: the same on every expert-parallel rank
        continue;
      }
      const int64_t e = std::stoll(m[2].str());
      if (e >= local)
        throw UserError(strprintf("%s holds local expert %lld, but %lld experts over %lld ranks give each %lld",
                                  part.path.c_str(), (long long)e, (long long)num_experts, (long long)ranks,
                                  (long long)local));
      out.tensors.emplace(m[1].str() + std::to_string(rank * local + e), t);
    }
  }
  return out;
}

MegatronCheckpoint merge_legacy_ranks(std::vector<std::vector<MegatronCheckpoint>> parts, bool gated_linear_unit,
                                      bool tied_embeddings, bool whole_experts) {
  MegatronCheckpoint out = parts.front().front();
  out.tensors.clear();
  int64_t offset = 0;
  for (size_t stage = 0; stage < parts.size(); ++stage) {
    const std::vector<MegatronCheckpoint>& ranks = parts[stage];
    std::set<int64_t> layers;
    for (const auto& [name, t0] : ranks.front().tensors) {
      if (tied_embeddings && parts.size() > 1 && stage + 1 == parts.size() && name.ends_with("output_layer.weight"))
        continue;  // the last stage's copy of the word embeddings
      std::vector<StoredTensor> pieces;
      for (const MegatronCheckpoint& r : ranks) {
        auto it = r.tensors.find(name);
        if (it == r.tensors.end())
          throw UserError(r.path + " lacks " + name + ", which the first tensor-parallel rank of its stage holds");
        if (r.iteration != out.iteration)
          throw UserError(r.path + " was saved at iteration " + std::to_string(r.iteration) + ", " +
                          out.path + " at " + std::to_string(out.iteration));
        pieces.push_back(it->second);
      }
      int64_t local = -1;
      const std::string global = shift_layer(name, offset, local);
      if (local >= 0) layers.insert(local);
      const TpSplit split =
          whole_experts && is_routed_expert_tensor(name) ? TpSplit::kReplicated : tp_split_of(name, gated_linear_unit);
      out.tensors[global] = join_tp_parts(pieces, split, ranks.front().path + ": " + name);
    }
    offset += int64_t(layers.size());
  }
  return out;
}

}  // namespace fp8tron::checkpoint::megatron
