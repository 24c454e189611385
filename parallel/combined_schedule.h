// Megatron's combined 1F1B schedule without pipeline parallelism (--overlap-moe-expert-parallel-comm,
// combined_1f1b.py): the forward pass of micro-batch i + 1 runs interleaved with the backward pass
// of micro-batch i, the two taking turns at every expert-parallel all-to-all (all_to_all_turns.h),
// so that each all-to-all of one micro-batch is in flight while the other computes.
//   F0 | B0 with F1 | B1 with F2 | ... | B(n-2) with F(n-1) | B(n-1)
// Within a pair the backward pass holds the turn first, as in Megatron's per-layer plan: its
// combine all-to-all goes out, then the forward pass computes attention and the router.
#pragma once
#include <torch/torch.h>

#include <functional>
#include <vector>

#include "parallel/all_to_all_turns.h"

namespace fp8tron {

// One slot of the schedule: a forward pass, a backward pass, or both taking turns (-1: none).
struct CombinedSlot {
  int64_t backward = -1;
  int64_t forward = -1;
};
std::vector<CombinedSlot> combined_1f1b_order(int64_t num_micro_batches);

// forward(micro_batch) returns the micro-batch's loss (0-dim); backward scales it by
// `loss_scale`. `before_last_backward` runs just before the step's last backward pass (gradient
// overlap). `after_backward` runs at the end of each backward pass, still on its side (before the
// forward side continues and before the next backward pass adds to the same gradients):
// --delay-wgrad-compute's held weight gradients of the layers after the pass's last all-to-all
// (the first layers'). Returns the sum of the losses (fp32 on `device`), added in micro-batch order.
torch::Tensor run_combined_1f1b(int64_t num_micro_batches, const std::function<torch::Tensor(int64_t)>& forward,
                                double loss_scale, const std::function<void()>& before_last_backward,
                                AllToAllTurns& turns, torch::Device device,
                                const std::function<void()>& after_backward = {});

}  // namespace fp8tron
