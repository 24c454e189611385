// --check-weight-hash-across-dp-replicas-interval: every N iterations (and at start) each rank
// hashes its parameters and the data-parallel replicas compare the hashes (Megatron's
// check_param_hashes_across_dp_replicas with cross_check): a mismatch stops training naming the
// first parameter that differs. The hash is FNV-1a over each parameter's fp32 bytes.
#pragma once
#include <torch/torch.h>

#include <string>
#include <vector>

#include "parallel/parallel_state.h"

namespace fp8tron {

// `params`: this rank's dense parameters by name, in the same order on every data-parallel
// replica; `expert_params`: its routed experts' parameters, compared over the expert
// data-parallel group (expert-parallel ranks hold different experts, as Megatron's check splits).
// Throws UserError when a replica differs; returns the line to log when all match.
std::string check_weight_hashes(const std::vector<std::pair<std::string, torch::Tensor>>& params,
                                const std::vector<std::pair<std::string, torch::Tensor>>& expert_params,
                                const ParallelState& parallel, int64_t iteration);

}  // namespace fp8tron
