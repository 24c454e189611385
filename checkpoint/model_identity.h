// What identifies the model a checkpoint belongs to (the fields that must agree on load) and the
// parallel layout it was saved in.
#pragma once
#include <string>
#include <vector>

#include "core/config/config.h"
#include "checkpoint/metadata.h"
#include "checkpoint/training_state.h"

namespace fp8tron {

struct ModelField {
  std::string key, value, flags;  // metadata key (after "model."), its value, the flags that set it
};
std::vector<ModelField> model_fields(const ModelConfig& m);

// Throws UserError listing every field in which the checkpoint at `path` differs from `c`.
void check_model(const checkpoint::CheckpointMetadata& m, const Config& c, const std::string& path);

checkpoint::ParallelLayout layout_of(const TrainingState& s);
std::string layout_string(const checkpoint::ParallelLayout& l);

}  // namespace fp8tron
