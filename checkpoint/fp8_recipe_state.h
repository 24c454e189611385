// The FP8 recipe state (delayed scaling's scales and amax histories) on its way out of a
// checkpoint, whichever format holds it: fp8tron's own (`<module>._extra_state`) or a torch_dist
// checkpoint fp8tron wrote (kTorchDistFp8StatePrefix + `<module>`).
#pragma once
#include <torch/torch.h>

#include <functional>

#include "checkpoint/training_state.h"

namespace fp8tron {
namespace fp8 {
struct Fp8Site;
}

// Gives every FP8 site of `s` the state `saved` returns for it (an undefined tensor: none saved).
// A checkpoint holding the state of some sites but not of others is refused (saved with other
// --first-last-layers-bf16 / --fp8-min-features); one holding none starts the recipe afresh, and
// says so for delayed scaling, whose scales then start from 1.
void restore_fp8_recipe_state(const TrainingState& s, const std::function<torch::Tensor(const fp8::Fp8Site&)>& saved);

}  // namespace fp8tron
