// Which transformer layers each pipeline rank's model chunks hold. Megatron's rules: layers are
// split evenly over pp x chunks virtual stages (virtual stage = chunk x pp + pp_rank); with
// --decoder-first/last-pipeline-num-layers the first and last stages take the given counts and
// the middle stages split the rest evenly; with --account-for-embedding/loss-in-pipeline-split the
// embedding and the loss each take one layer's slot; --pipeline-model-parallel-layout places every
// layer explicitly.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
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

// How the model is spread over the pipeline (everything but the sizes is optional).
struct PipelineSplit {
  int64_t num_layers = 0;
  int pp = 1;
  int chunks = 1;  // virtual stages per rank
  std::optional<int64_t> first_stage_layers, last_stage_layers;
  bool account_for_embedding = false, account_for_loss = false;
  std::vector<std::string> layout;  // parsed --pipeline-model-parallel-layout (chunks = stages / pp)
};

// One model chunk: its layers and whether it holds the embedding (first virtual stage or the
// layout's E) and the loss (last virtual stage or the layout's L; also the MTP layers).
struct ChunkPlan {
  int64_t first_layer = 0, num_layers = 0;
  bool embedding = false, loss = false;
};

// The chunks of `pp_rank`, in chunk order. Throws UserError naming the flags when impossible.
std::vector<ChunkPlan> plan_pipeline_chunks(const PipelineSplit& split, int pp_rank);

}  // namespace fp8tron
