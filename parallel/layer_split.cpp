#include "parallel/layer_split.h"

#include <string>

#include "core/error.h"
#include "core/text.h"

namespace fp8tron {

std::vector<LayerRange> split_layers(int64_t num_layers, int pp, int pp_rank, int chunks, std::optional<int64_t> first,
                                     std::optional<int64_t> last) {
  const int stages = pp * chunks;
  std::vector<int64_t> counts(size_t(stages), 0);
  if (first || last) {
    if (chunks > 1)
      throw UserError("--decoder-first/last-pipeline-num-layers cannot be combined with a virtual pipeline");
    if (pp < 2) throw UserError("--decoder-first/last-pipeline-num-layers need --pipeline-model-parallel-size > 1");
    int64_t rest = num_layers - first.value_or(0) - last.value_or(0);
    int middle = pp - int(bool(first)) - int(bool(last));
    if (rest < 0) throw UserError("--decoder-first/last-pipeline-num-layers add up to more than --num-layers");
    if (middle == 0 ? rest != 0 : rest % middle != 0)
      throw UserError(strprintf("the %lld layers left after --decoder-first/last-pipeline-num-layers do not split evenly over "
                                "the %d middle pipeline stages",
                                (long long)rest, middle));
    for (int s = 0; s < pp; ++s) counts[size_t(s)] = middle ? rest / middle : 0;
    if (first) counts.front() = *first;
    if (last) counts.back() = *last;
  } else {
    if (num_layers % stages != 0)
      throw UserError(strprintf("--num-layers (%lld) is not divisible by the %d pipeline stages%s", (long long)num_layers, stages,
                                chunks > 1 ? " (pipeline size x virtual stages per rank)" : ""));
    for (auto& c : counts) c = num_layers / stages;
  }
  std::vector<LayerRange> mine;
  int64_t start = 0;
  for (int s = 0; s < stages; ++s) {
    if (s % pp == pp_rank) mine.push_back({start, counts[size_t(s)]});
    start += counts[size_t(s)];
  }
  return mine;
}

}  // namespace fp8tron
