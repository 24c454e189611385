#include "models/linear/modules.h"

namespace fp8tron {
namespace {

void add_defined(std::vector<torch::Tensor>& out, const torch::Tensor& weight, const torch::Tensor& bias) {
  if (weight.defined()) out.push_back(weight);
  if (bias.defined()) out.push_back(bias);
}

}  // namespace

std::vector<torch::Tensor> gemm_written_params(const torch::nn::Module& model) {
  std::vector<torch::Tensor> params;
  for (const auto& m : model.modules(/*include_self=*/false)) {
    if (const auto* c = dynamic_cast<const TEColumnParallelLinearImpl*>(m.get())) {
      if (c->plan().path == LinearPath::kPlain && !c->options.external_weight) add_defined(params, c->weight, c->bias);
    } else if (const auto* n = dynamic_cast<const TELayerNormColumnParallelLinearImpl*>(m.get())) {
      if (n->plan().path == LinearPath::kPlain) add_defined(params, n->weight, n->bias);
    } else if (const auto* r = dynamic_cast<const TERowParallelLinearImpl*>(m.get())) {
      // With tensor parallelism the bias is added after the reduction, by autograd.
      if (r->plan().path == LinearPath::kPlain)
        add_defined(params, r->weight, r->plan().bias == BiasPlacement::kAfterReduction ? torch::Tensor() : r->bias);
    }
  }
  return params;
}

std::vector<std::pair<std::string, LinearPlan>> linear_plans(const torch::nn::Module& model) {
  std::vector<std::pair<std::string, LinearPlan>> out;
  for (const auto& item : model.named_modules("", /*include_self=*/false)) {
    const auto* m = item.value().get();
    if (const auto* c = dynamic_cast<const TEColumnParallelLinearImpl*>(m)) out.emplace_back(item.key(), c->plan());
    else if (const auto* n = dynamic_cast<const TELayerNormColumnParallelLinearImpl*>(m)) out.emplace_back(item.key(), n->plan());
    else if (const auto* r = dynamic_cast<const TERowParallelLinearImpl*>(m)) out.emplace_back(item.key(), r->plan());
  }
  return out;
}

}  // namespace fp8tron
