// What running an iteration changes besides the weights and the optimizer state, captured before
// its first pass so that the rerun engine (rerun/) can run it again from the same state:
// the dropout generators, the FP8 delayed-scaling state (amax histories, scales, step count), and
// the model's buffers (the MoE routers' expert biases, which a step's token counts move). The
// weights and the optimizer state need no copy: a rejected pass's optimizer step is skipped on the
// device. The micro-batches are replayed by index (the loader serves any sample again).
// Capturing clones a few small device buffers and reads host-side generator state: no GPU wait.
#pragma once
#include <torch/torch.h>

#include <memory>
#include <optional>
#include <vector>

#include "fp8/fp8_linear.h"
#include "models/moe/moe_context.h"
#include "models/recompute/rng_snapshot.h"

namespace fp8tron {

class StepSnapshot {
 public:
  StepSnapshot(const torch::Device& device, fp8::Fp8Engine* fp8, std::vector<torch::Tensor> buffers);
  // Puts everything captured back; the MoE metrics the step's passes recorded (they start every
  // step from zero) are dropped.
  void restore(MoeContext* moe) const;

 private:
  RngSnapshot rng_;
  fp8::Fp8Engine* fp8_;
  std::optional<fp8::Fp8Engine::StepState> fp8_state_;
  std::vector<torch::Tensor> buffers_, saved_;
};

}  // namespace fp8tron
