// The FP8 recipe state (delayed scaling's scales and amax histories) on its way out of a
// checkpoint, whichever format holds it: fp8tron's own (`<module>._extra_state`) or a torch_dist
// checkpoint fp8tron wrote (kTorchDistFp8StatePrefix + `<module>`).
#pragma once
#include <torch/torch.h>

#include <functional>
#include <vector>

#include "checkpoint/training_state.h"

namespace fp8tron {
namespace fp8 {
struct Fp8Site;
}

// The saved state of every FP8 site of `s`, in sites() order: what `saved` returns for it (an
// undefined tensor where none is saved). UserError when some sites have one and others not (saved
// with another --first-last-layers-bf16 / --fp8-min-features); read before anything is loaded.
std::vector<torch::Tensor> read_fp8_recipe_state(const TrainingState& s,
                                                 const std::function<torch::Tensor(const fp8::Fp8Site&)>& saved);

// Gives every FP8 site its state from read_fp8_recipe_state(); with none saved the recipe starts
// afresh, which is said for delayed scaling (its scales then start from 1).
void restore_fp8_recipe_state(const TrainingState& s, const std::vector<torch::Tensor>& states);

}  // namespace fp8tron
