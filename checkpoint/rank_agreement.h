// Small collectives over every rank that saving and loading use to agree: whether any rank
// failed, a barrier, strings gathered from all ranks, and a token shared by all.
#pragma once
#include <torch/torch.h>

#include <string>
#include <vector>

#include "parallel/parallel_state.h"

namespace fp8tron {

bool any_rank(const ParallelState& p, const torch::Device& device, bool flag);
void barrier(const ParallelState& p);
// Every rank's string, by rank, on every rank.
std::vector<std::string> all_gather_strings(const ParallelState& p, const torch::Device& device, const std::string& mine);
// Length-prefixed fields in one string (for one all-gather), and back.
std::string pack(const std::vector<std::string>& fields);
std::vector<std::string> unpack(const std::string& packed);
// The same token on every rank: rank 0's clock.
std::string agree_on_token(const ParallelState& p, const torch::Device& device);

}  // namespace fp8tron
