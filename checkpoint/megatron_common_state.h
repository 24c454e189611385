// The "common state" of a checkpoint in Megatron's torch_dist format: what Megatron-LM's
// generate_state_dict puts beside the sharded tensors and stores as one ShardedObject
// ("common_state/shard_0_1", torch.save bytes of a one-item list), and reads first on load:
// checkpoint_version 3.0, iteration, args (an argparse.Namespace of the run's arguments, with the
// consumed samples, world and data-parallel sizes and no_save_rng), optimizer (its param_groups
// and Adam's common_step; the moments are sharded tensors), opt_param_scheduler,
// num_floating_point_operations_so_far and content_metadata.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "checkpoint/megatron_param_groups.h"
#include "checkpoint/metadata.h"
#include "checkpoint/training_state.h"

namespace fp8tron {

// How the common state is stored: as the "common_state" object inside the distributed checkpoint
// (Megatron-Core 0.19 on: a list of the one replica saved), or as common.pt beside it (the state
// dict itself, what Megatron-Core's releases up to 0.18 read; later ones read it first when present).
enum class CommonStateFile { kDcpObject, kCommonPt };

// Rank 0: the torch.save bytes of the common state at `iteration`. `groups`: the optimizer's
// parameter groups (gather_megatron_param_groups); `rng`: every rank's RNG states (empty: none
// saved), stored under megatron::kFp8tronRngStateKey.
std::string megatron_common_state_bytes(const TrainingState& s, int64_t iteration,
                                        const std::vector<MegatronParamGroup>& groups,
                                        const std::vector<std::vector<checkpoint::RngState>>& rng = {},
                                        CommonStateFile file = CommonStateFile::kDcpObject);

}  // namespace fp8tron
