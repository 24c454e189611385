// How a built model chunk runs, module by module, for --print-model-plan: each linear's plan
// (models/linear/linear_plan.h), each MLP's activation path and each expert group's GEMMs, read
// from the modules themselves, so the text is what the run does. Transformer layers whose modules
// run alike print once as a range ("layers 0-11").
#pragma once
#include <torch/torch.h>

#include <string>
#include <vector>

namespace fp8tron {

struct ModulePlan {
  std::string name;  // the module's global name ("decoder.layers.3.mlp.linear_fc1")
  std::string plan;  // one line
};

// The chunk's planned modules in registration order.
std::vector<ModulePlan> model_plan(const torch::nn::Module& chunk);

// The plan as indented lines, consecutive layers with the same plan merged.
std::string format_model_plan(const std::vector<ModulePlan>& plan);

}  // namespace fp8tron
