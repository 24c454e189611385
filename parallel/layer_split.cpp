#include "parallel/layer_split.h"

#include <algorithm>
#include <string>

#include "core/error.h"
#include "core/text.h"

namespace fp8tron {
namespace {

// Layers of every virtual stage, in virtual-stage order (stage = chunk x pp + rank).
std::vector<int64_t> stage_layer_counts(const PipelineSplit& p) {
  const int stages = p.pp * p.chunks;
  std::vector<int64_t> counts(size_t(stages), 0);
  const auto& first = p.first_stage_layers;
  const auto& last = p.last_stage_layers;
  if (!p.layout.empty()) {
    for (int s = 0; s < stages; ++s) counts[size_t(s)] = int64_t(std::count(p.layout[size_t(s)].begin(), p.layout[size_t(s)].end(), 't'));
    return counts;
  }
  if (first || last) {
    if (p.pp < 2) throw UserError("--decoder-first/last-pipeline-num-layers need --pipeline-model-parallel-size > 1");
    const int v = p.chunks;
    for (auto [n, flag] : {std::pair{first, "--decoder-first-pipeline-num-layers"}, {last, "--decoder-last-pipeline-num-layers"}}) {
      if (!n) continue;
      if (*n <= 0) throw UserError(std::string(flag) + " must be positive");
      if (*n % v != 0)
        throw UserError(strprintf("%s (%lld) is not divisible by the %d virtual stages per pipeline rank", flag, (long long)*n, v));
    }
    const int64_t rest = p.num_layers - first.value_or(0) - last.value_or(0);
    const int middle = p.pp - int(bool(first)) - int(bool(last));
    if (rest < 0) throw UserError("--decoder-first/last-pipeline-num-layers add up to more than --num-layers");
    if ((rest != 0) != (middle != 0) || (middle && rest % (int64_t(middle) * v) != 0))
      throw UserError(strprintf("the %lld layers left after --decoder-first/last-pipeline-num-layers do not split evenly over "
                                "the %d middle pipeline stages%s",
                                (long long)rest, middle, v > 1 ? " and their virtual stages" : ""));
    for (int s = 0; s < stages; ++s) {
      const int rank = s % p.pp;
      counts[size_t(s)] = rank == 0 && first ? *first / v
                          : rank == p.pp - 1 && last ? *last / v
                                                     : (middle ? rest / middle / v : 0);
    }
    return counts;
  }
  // The embedding and the loss may each take a layer's slot (--account-for-*-in-pipeline-split).
  const int64_t slots = p.num_layers + int64_t(p.account_for_embedding) + int64_t(p.account_for_loss);
  const bool accounted = p.account_for_embedding || p.account_for_loss;
  if (slots % stages != 0)
    throw UserError(strprintf("--num-layers (%lld%s) is not divisible by the %d pipeline stages%s", (long long)p.num_layers,
                              accounted ? strprintf(", %lld with the embedding/loss slots", (long long)slots).c_str() : "",
                              stages, p.chunks > 1 ? " (pipeline size x virtual stages per rank)" : ""));
  for (auto& c : counts) c = slots / stages;
  if (p.account_for_embedding) counts.front() -= 1;
  if (p.account_for_loss) counts.back() -= 1;
  for (auto c : counts)
    if (c < 0) throw UserError("--account-for-embedding/loss-in-pipeline-split leave a stage with fewer than no layers");
  return counts;
}

}  // namespace

std::vector<ChunkPlan> plan_pipeline_chunks(const PipelineSplit& p, int pp_rank) {
  const int stages = p.pp * p.chunks;
  if (!p.layout.empty() && int(p.layout.size()) != stages)
    throw UserError("--pipeline-model-parallel-layout: the number of stages is not pipeline size x virtual stages");
  const std::vector<int64_t> counts = stage_layer_counts(p);
  std::vector<ChunkPlan> mine;
  int64_t start = 0;
  for (int s = 0; s < stages; ++s) {
    if (s % p.pp == pp_rank) {
      ChunkPlan c{start, counts[size_t(s)], s == 0, s == stages - 1};
      if (!p.layout.empty()) {
        c.embedding = p.layout[size_t(s)].find('E') != std::string::npos;
        c.loss = p.layout[size_t(s)].find('L') != std::string::npos;
      }
      mine.push_back(c);
    }
    start += counts[size_t(s)];
  }
  return mine;
}

std::vector<LayerRange> split_layers(int64_t num_layers, int pp, int pp_rank, int chunks, std::optional<int64_t> first,
                                     std::optional<int64_t> last) {
  PipelineSplit p;
  p.num_layers = num_layers;
  p.pp = pp;
  p.chunks = chunks;
  p.first_stage_layers = first;
  p.last_stage_layers = last;
  std::vector<LayerRange> out;
  for (const auto& c : plan_pipeline_chunks(p, pp_rank)) out.push_back({c.first_layer, c.num_layers});
  return out;
}

}  // namespace fp8tron
