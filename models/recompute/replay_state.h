// What a recomputed forward pass must reproduce or leave alone (models/recompute/recompute.h,
// models/recompute/output_discarding_recompute.h): the dropout generators' states, whether this thread runs
// the first pass of a recomputed function, and the FP8 forward-replay mode.
#pragma once
#include <torch/torch.h>

#include "fp8/forward_replay.h"
#include "models/recompute/rng_snapshot.h"

namespace fp8tron {

// Puts the generators in a captured state for its lifetime, then back where they were.
class RngReplay {
 public:
  explicit RngReplay(const RngSnapshot& replayed);
  ~RngReplay();
  RngReplay(const RngReplay&) = delete;
  RngReplay& operator=(const RngReplay&) = delete;

 private:
  RngSnapshot current_;
};

// Sets whether this thread runs a first pass (recompute_first_pass_active()), for the guard's
// lifetime: true around a recomputed function's first pass (nested functions included), false
// around a replay (never a first pass, even when it runs inside one).
class FirstPassGuard {
 public:
  explicit FirstPassGuard(bool active);
  ~FirstPassGuard();
  FirstPassGuard(const FirstPassGuard&) = delete;
  FirstPassGuard& operator=(const FirstPassGuard&) = delete;

 private:
  bool previous_;
};

// Detached copies of `inputs` (sharing their memory) that require gradients where they do.
std::vector<torch::Tensor> detached_like(const std::vector<torch::Tensor>& inputs);

// Everything a replay runs under: the captured generators, not a first pass, no FP8 amax
// recording, gradients recorded.
class ReplayScope {
 public:
  explicit ReplayScope(const RngSnapshot& rng) : rng_(rng), not_first_(false), grad_(true) {}

 private:
  RngReplay rng_;
  FirstPassGuard not_first_;
  fp8::ForwardReplayGuard no_amax_recording_;
  torch::AutoGradMode grad_;
};

}  // namespace fp8tron
