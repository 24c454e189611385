// Megatron's optimizer parameter groups, as its _get_param_groups forms them
// (megatron/core/optimizer/__init__.py): each parameter's overrides of the defaults make its
// group (wd_mult 0 for biases and 1-D weights; --decoupled-lr's max_lr/min_lr for the embedding
// and output layer; MuP's scaled max_lr, min_lr and Adam epsilon for the hidden matrices), the
// routed experts' apart (their own optimizer). Megatron gathers the groups of every rank, so all
// ranks hold the same list, sorted with the parameters that override nothing first, then by their
// sorted overrides; a checkpoint's param_groups are matched to the loading run's by position.
// fp8tron decides each parameter's treatment by the same rules (optim/param_groups.h).
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "checkpoint/training_state.h"
#include "optim/param_groups.h"

namespace fp8tron {

struct MegatronParamGroup {
  bool expert = false;    // the routed experts' optimizer (Megatron's is_expert_parallel)
  bool no_decay = false;  // wd_mult 0
  LrGroup lr_group = LrGroup::Base;
  bool scaled_eps = false;  // MuP's Adam epsilon / m
  bool operator==(const MegatronParamGroup&) const = default;
};

// The overrides of a group as Megatron's sorted (key, value) tuple; empty: none (its None key).
std::vector<std::pair<std::string, double>> megatron_group_overrides(const MegatronParamGroup& g,
                                                                     const OptimizerConfig& config);

// Every rank's groups, in Megatron's order (a collective over all ranks).
std::vector<MegatronParamGroup> gather_megatron_param_groups(const TrainingState& s);

}  // namespace fp8tron
