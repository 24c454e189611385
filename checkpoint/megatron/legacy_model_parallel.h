// Megatron's legacy torch checkpoints saved by several model-parallel ranks: one
// mp_rank_<tp>[_<pp>]/model_optim_rng.pt per tensor- and pipeline-parallel rank, each holding its
// rank's part of the weights and of Adam's moments under the stage's local layer numbers. They are
// put together into global tensors:
//   - a pipeline stage's layers are numbered after the layers of the stages before it (stages may
//     hold different numbers of layers);
//   - tensor-parallel parts are joined as Megatron split them (tensor_parallel_split.h); a tensor
//     the same on every rank is taken from the first;
//   - the last stage's copy of tied word embeddings (output_layer.weight) is dropped.
#pragma once
#include <string>
#include <vector>

#include "checkpoint/megatron/megatron_checkpoint.h"

namespace fp8tron::checkpoint::megatron {

struct LegacyRankFile {
  std::string path;  // .../mp_rank_TT[_PPP]/model_optim_rng.pt
  int tp_rank = 0, pp_rank = 0;
};

// The rank files of legacy checkpoint directory `dir` (an iter_NNNNNNN), every (tp, pp) pair
// present; UserError naming what is missing or what fp8tron does not read (expert-parallel files).
std::vector<LegacyRankFile> legacy_rank_files(const std::string& dir);

// One checkpoint of global tensors from the ranks' (parts[pp][tp], each read on its own with its
// stage's local layer numbers); the counters and arguments are the first part's.
MegatronCheckpoint merge_legacy_ranks(std::vector<std::vector<MegatronCheckpoint>> parts, bool gated_linear_unit,
                                      bool tied_embeddings);

}  // namespace fp8tron::checkpoint::megatron
