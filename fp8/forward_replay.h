// Activation recomputation replays a forward pass during backward (models/recompute/recompute.h). The
// replay must quantize exactly as the original pass did and must not record amaxes a second
// time. While a ForwardReplayGuard lives on a thread, the FP8 linears on that thread record no
// amaxes and cache no re-quantised weight: they use the scales and the cached FP8 weights of the
// original pass, which are still current because scales and weights only change in
// Fp8Engine::end_step, after the step's last backward pass. Gradient casts in the backward pass
// that follows the replay record as usual (the guard is gone by then).
// Thread-local like autograd's grad mode: the replay runs on the thread that runs the backward.
#pragma once

namespace fp8tron::fp8 {

class ForwardReplayGuard {
 public:
  ForwardReplayGuard();
  ~ForwardReplayGuard();
  ForwardReplayGuard(const ForwardReplayGuard&) = delete;
  ForwardReplayGuard& operator=(const ForwardReplayGuard&) = delete;

 private:
  bool previous_;
};

// Whether the forward pass running on this thread is a replay.
bool forward_replay_active();

}  // namespace fp8tron::fp8
