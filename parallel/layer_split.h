// Which transformer layers each pipeline rank's model chunks hold. Megatron's rules: layers are
// split evenly over pp x chunks virtual stages (virtual stage = chunk x pp + pp_rank); with
// --decoder-first/last-pipeline-num-layers the first and last stages take the given counts and
// the middle stages split the rest evenly.
#pragma once
#include <cstdint>
#include <optional>
#include <vector>

namespace fp8tron {

struct LayerRange {
  int64_t first = 0;
  int64_t count = 0;
};

// Layer ranges of `pp_rank`'s chunks, in chunk order. Throws UserError naming the flags when the
// layers cannot be split that way.
std::vector<LayerRange> split_layers(int64_t num_layers, int pp, int pp_rank, int chunks,
                                     std::optional<int64_t> first_stage_layers, std::optional<int64_t> last_stage_layers);

}  // namespace fp8tron
