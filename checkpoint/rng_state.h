// The CPU and CUDA generators' states: saved per rank, restored when the layout is unchanged.
#pragma once
#include <torch/torch.h>

#include <string>
#include <vector>

#include "checkpoint/metadata.h"
#include "checkpoint/training_state.h"

namespace fp8tron {

std::string generator_state(const torch::Device& device);
// This process's generator states as (name, state) pairs in a row: "cpu", and "cuda" when
// `device` is a GPU (both formats' saves gather them from every rank).
std::vector<std::string> generator_fields(const torch::Device& device);
// Throws UserError naming `source` when the bytes are not a state of that generator.
void set_generator_state(const torch::Device& device, const std::string& bytes, const std::string& source);

// This rank's states from the checkpoint at `path`, when it was saved in the same layout (else
// the random streams continue from --seed, said once in the log).
void restore_rng(const checkpoint::CheckpointMetadata& m, const TrainingState& s, const std::string& path);
// The same from every rank's `states` saved in layout `saved` (a torch_dist checkpoint's).
void restore_rng_states(const std::vector<checkpoint::RngState>& states, const checkpoint::ParallelLayout& saved,
                        const TrainingState& s, const std::string& path);

}  // namespace fp8tron
