// Megatron's legacy torch checkpoints saved by several model-parallel ranks: one
// mp_rank_<tp>[_<pp>]/model_optim_rng.pt per tensor- and pipeline-parallel rank, each holding its
// rank's part of the weights and of Adam's moments under the stage's local layer numbers. They are
// put together into global tensors:
//   - a pipeline stage's layers are numbered after the layers of the stages before it (stages may
//     hold different numbers of layers);
//   - tensor-parallel parts are joined as Megatron split them (tensor_parallel_split.h); a tensor
//     the same on every rank is taken from the first;
//   - the last stage's copy of tied word embeddings (output_layer.weight) is dropped.
// With expert parallelism every expert-parallel rank of a stage has a file of its own,
// mp_rank_<tp>[_<pp>]_<ep>, holding the dense weights (the same on every one) and its local
// experts, numbered from 0: they become the global experts ep x (experts per rank) + local; with
// tensor parallelism too, each tensor-parallel rank's experts are put together first, then split
// parts joined as the dense MLP's. With whole experts on every tensor-parallel rank
// (--expert-tensor-parallel-size 1) Megatron's expert and dense rank grids differ: only the ranks
// first in their data-parallel or expert-data-parallel group write, so some (tp, ep) pairs have no
// file (TP2 x EP2 over four ranks writes mp_rank_00_000 and mp_rank_01_001); each tensor-parallel
// rank's dense part and each expert-parallel rank's experts are then taken from any file that holds
// them.
#pragma once
#include <string>
#include <vector>

#include "checkpoint/megatron/megatron_checkpoint.h"

namespace fp8tron::checkpoint::megatron {

struct LegacyRankFile {
  std::string path;  // .../mp_rank_TT[_PPP][_EEE]/model_optim_rng.pt
  int tp_rank = 0, pp_rank = 0, ep_rank = 0;
};

// The saving run's layout, from the arguments in its rank files (1 where they do not say).
struct LegacyLayout {
  int64_t tensor_parallel = 1, pipeline_parallel = 1, expert_parallel = 1;
  int64_t expert_tensor_parallel = 0;  // 0: as tensor_parallel (Megatron's default)
};

// The rank files of legacy checkpoint directory `dir` (an iter_NNNNNNN) that `saved` wrote, every
// (tp, pp, ep) triple present, ordered by pipeline stage, then tensor-parallel rank, then
// expert-parallel rank. The layout tells Megatron's mp_rank_TT_EEE (expert parallelism without a
// pipeline) from mp_rank_TT_PPP, and which files are missing. UserError naming what is missing, or
// expert- and tensor-parallel ranks whose experts are split otherwise than the dense layers or
// whole (--expert-tensor-parallel-size other than --tensor-model-parallel-size and 1: not read).
std::vector<LegacyRankFile> legacy_rank_files(const std::string& dir, const LegacyLayout& saved);

// Whether the saved run kept whole experts on tensor-parallel ranks (--expert-tensor-parallel-size
// 1 with --tensor-model-parallel-size above 1 and expert parallelism).
bool experts_whole_on_tensor_ranks(const LegacyLayout& saved);

// The first rank file of `dir` (mp_rank_00, or mp_rank_00_000...), whose arguments tell the
// saving run's layout; UserError when there is none.
std::string first_legacy_rank_file(const std::string& dir);

// One checkpoint of the expert-parallel ranks' parts of one stage (`parts` ordered by expert rank,
// each read on its own): the dense tensors of the first, the local experts of each renumbered
// globally, their optimizer state alike. `num_experts`: the model's routed experts.
MegatronCheckpoint merge_expert_ranks(std::vector<MegatronCheckpoint> parts, int64_t num_experts);

// One checkpoint of global tensors from the ranks' (parts[pp][tp], each read on its own with its
// stage's local layer numbers); the counters and arguments are the first part's. `whole_experts`:
// the routed experts are the same on every tensor-parallel rank (taken from the first).
MegatronCheckpoint merge_legacy_ranks(std::vector<std::vector<MegatronCheckpoint>> parts, bool gated_linear_unit,
                                      bool tied_embeddings, bool whole_experts = false);

// Whether `name` (behind any optimizer prefix) is a routed expert's weight or bias in fp8tron's
// names (...mlp.experts.linear_fc<k>.weight<e>).
bool is_routed_expert_tensor(const std::string& name);

}  // namespace fp8tron::checkpoint::megatron
