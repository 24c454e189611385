#include "models/norm/te_layer_norm.h"

#include "models/linear/linear_options.h"

namespace fp8tron {

void add_norm_params(ShardedModule& m, const NormOptions& o, bool partial_grads, const ModuleFactory& f,
                     const std::string& prefix, torch::Tensor& weight, torch::Tensor& bias) {
  const ParamInfo info = replicated_param({o.size}, partial_grads);
  weight = m.add_param(prefix + "weight", f.constant(info, o.zero_centered_gamma ? 0.0 : 1.0), info);
  if (o.kind == Normalization::LayerNorm) bias = m.add_param(prefix + "bias", f.constant(info, 0.0), info);
}

TELayerNormImpl::TELayerNormImpl(const NormOptions& o, bool partial_grads, const ModuleFactory& f)
    : options(o), main_grads(f.main_grads()) {
  add_norm_params(*this, o, partial_grads && f.tp().size > 1, f, "", weight, bias);
}

torch::Tensor TELayerNormImpl::forward(const torch::Tensor& x) { return apply_norm(x, options, weight, bias, main_grads); }

ResidualNormOutput TELayerNormImpl::forward_residual(const ResidualStream& in) {
  return residual_add_norm(in.residual, in.branch, options, weight, bias, in.branch_bias, main_grads);
}

}  // namespace fp8tron
