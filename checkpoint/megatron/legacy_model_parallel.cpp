#include "checkpoint/megatron/legacy_model_parallel.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <regex>
#include <set>

#include "checkpoint/megatron/tensor_parallel_split.h"
#include "core/error.h"
#include "core/text.h"

namespace fp8tron::checkpoint::megatron {
namespace fs = std::filesystem;
namespace {

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

std::vector<LegacyRankFile> legacy_rank_files(const std::string& dir) {
  static const std::regex kRank(R"(^mp_rank_(\d\d)(?:_(\d\d\d))?(_\d\d\d)?$)");
  std::vector<LegacyRankFile> files;
  std::set<std::pair<int, int>> seen;
  int tp = 0, pp = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string base = e.path().filename().string();
    std::smatch m;
    if (!std::regex_match(base, m, kRank)) continue;
    if (m[3].matched)
      throw UserError("checkpoint " + dir + " holds " + base + ", an expert-parallel rank's file; fp8tron reads "
                      "Megatron torch checkpoints of tensor- and pipeline-parallel ranks: save with "
                      "--ckpt-format torch_dist (or --expert-model-parallel-size 1)");
    LegacyRankFile f{e.path().string() + "/model_optim_rng.pt", std::stoi(m[1].str()),
                     m[2].matched ? std::stoi(m[2].str()) : 0};
    tp = std::max(tp, f.tp_rank + 1), pp = std::max(pp, f.pp_rank + 1);
    seen.insert({f.tp_rank, f.pp_rank});
    files.push_back(f);
  }
  if (files.empty()) throw UserError("checkpoint " + dir + " holds no mp_rank_* directory");
  for (int p = 0; p < pp; ++p)
    for (int t = 0; t < tp; ++t)
      if (!seen.count({t, p}))
        throw UserError(strprintf("checkpoint %s lacks the directory of tensor-parallel rank %d, pipeline stage %d "
                                  "(mp_rank_%02d%s): copy the whole checkpoint",
                                  dir.c_str(), t, p, t, pp > 1 ? strprintf("_%03d", p).c_str() : ""));
  std::sort(files.begin(), files.end(), [](const LegacyRankFile& a, const LegacyRankFile& b) {
    return std::tie(a.pp_rank, a.tp_rank) < std::tie(b.pp_rank, b.tp_rank);
  });
  return files;
}

MegatronCheckpoint merge_legacy_ranks(std::vector<std::vector<MegatronCheckpoint>> parts, bool gated_linear_unit,
                                      bool tied_embeddings) {
  MegatronCheckpoint out = parts.front().front();
  out.tensors.clear();
  int64_t offset = 0;
  for (size_t stage = 0; stage < parts.size(); ++stage) {
    const std::vector<MegatronCheckpoint>& ranks = parts[stage];
    std::set<int64_t> layers;
    for (const auto& [name, t0] : ranks.front().tensors) {
      if (tied_embeddings && parts.size() > 1 && stage + 1 == parts.size() && name.ends_with("output_layer.weight"))
        continue;  // the last stage's copy of the word embeddings
      std::vector<torch::Tensor> pieces;
      for (const MegatronCheckpoint& r : ranks) {
        auto it = r.tensors.find(name);
        if (it == r.tensors.end())
          throw UserError(r.path + " lacks " + name + ", which the first tensor-parallel rank of its stage holds");
        if (r.iteration != out.iteration)
          throw UserError(r.path + " was saved at iteration " + std::to_string(r.iteration) + ", " +
                          out.path + " at " + std::to_string(out.iteration));
        pieces.push_back(it->second.read());
      }
      int64_t local = -1;
      const std::string global = shift_layer(name, offset, local);
      if (local >= 0) layers.insert(local);
      out.tensors[global] = join_tp_parts(pieces, tp_split_of(name, gated_linear_unit), ranks.front().path + ": " + name);
    }
    offset += int64_t(layers.size());
  }
  return out;
}

}  // namespace fp8tron::checkpoint::megatron
