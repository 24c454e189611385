// Activation recomputation (Megatron's tensor_parallel.checkpoint): run part of the forward pass
// keeping only its inputs, and run it again during backward to get the activations its gradient
// needs.
//
// The recomputed pass must be the same computation as the original one:
//  - dropout: the CPU and CUDA default generators (fp8tron's dropout streams) are captured before
//    the first run and restored for the replay, so every mask is drawn again identically; the
//    generators' own states are put back afterwards, so the rest of training draws as if nothing
//    had been replayed;
//  - FP8: the replay runs under fp8::ForwardReplayGuard, so it records no amaxes a second time
//    and quantizes with the scales and cached FP8 weights of the original pass;
//  - kernels: both runs have autograd recording. The original run builds its graph on detached
//    inputs and drops it as soon as it returns, so no activation outlives it, but every choice
//    that depends on whether gradients are wanted (fused attention backend, the FP8 linears'
//    fused norm cast) is taken the same way in both runs, and the outputs are bitwise equal.
//    (Megatron runs the first pass under no_grad; its peak memory is the replay's anyway.)
//  - side effects that belong with the gradients (the MoE router's auxiliary losses, their logged
//    values and the token counts of the expert bias) happen once, in the replay: the first pass
//    skips them (recompute_first_pass_active()), as Megatron's first pass under no_grad does.
//    The replays run in the order of the forward passes, so accumulations over a step's
//    micro-batches (--moe-router-load-balancing-type global_aux_loss) see the same values.
// Gradients of parameters used inside the function are produced by a nested backward pass
// through the replayed graph (as Megatron's re-entrant checkpoint does), so they accumulate into
// the parameters' gradients (the optimizer's main-gradient buffer) and fire the same hooks.
#pragma once
#include <torch/torch.h>

#include <functional>
#include <vector>

#include "core/config/recompute_config.h"
#include "parallel/communicator.h"

namespace fp8tron {

using RecomputeFn = std::function<torch::Tensor(const std::vector<torch::Tensor>& inputs)>;

struct RecomputeOptions {
  // --distribute-saved-activations: the first input is kept as this rank's 1/size part (it is
  // replicated over the tensor-parallel group without sequence parallelism) and all-gathered
  // before the replay. Null: kept whole.
  Communicator* distribute_over = nullptr;
};

// fn(inputs) with recomputation in backward. `fn` is called again during backward, with the
// inputs detached (requiring gradients as the originals do); it must read no state that changes
// between the forward and the backward pass besides the RNG. Without grad mode this is fn(inputs).
torch::Tensor recompute(const RecomputeFn& fn, const std::vector<torch::Tensor>& inputs, const RecomputeOptions& options = {});

// Whether the forward pass running on this thread is the first pass of a recomputed function (the
// one whose graph is dropped). Thread-local like autograd's grad mode.
bool recompute_first_pass_active();

// Full granularity: how a model chunk's `layers` layers are grouped (Megatron's
// _checkpointed_forward over the chunk's layers, with each virtual pipeline chunk its own block).
//   uniform: units of --recompute-num-layers consecutive layers (the last may be shorter), each
//            recomputed from its input;
//   block:   each of the first --recompute-num-layers layers recomputed from its own input, the
//            remaining layers kept.
// Other granularities: one unit of all layers, not recomputed.
struct LayerUnit {
  int64_t begin = 0, end = 0;  // [begin, end) of the chunk's layers
  bool recomputed = false;
};
std::vector<LayerUnit> layer_units(const RecomputeConfig& config, int64_t layers);

}  // namespace fp8tron
