#include "models/linear/linear_options.h"

#include <algorithm>

#include "fp8/fp8_linear.h"

namespace fp8tron {

int64_t layer_number(const std::string& name) {
  const std::string prefix = "decoder.layers.";
  if (name.rfind(prefix, 0) != 0) return -1;
  return std::stoll(name.substr(prefix.size()));
}

int64_t per_layer_index(const std::string& name) {
  const std::string mtp = "mtp.layers.";
  if (name.rfind(mtp, 0) == 0) return std::stoll(name.substr(mtp.size()));
  return std::max<int64_t>(layer_number(name), 0);
}

ParamInfo replicated_param(std::vector<int64_t> shape, bool partial_grads) {
  ParamInfo info;
  info.global_shape = std::move(shape);
  info.reduce_grad_over_tp = partial_grads;
  return info;
}

ParamInfo split_param(std::vector<int64_t> shape, int dim, int interleave) {
  ParamInfo info;
  info.global_shape = std::move(shape);
  info.partition_dim = dim;
  info.interleave = interleave;
  return info;
}

std::shared_ptr<fp8::Fp8Site> fp8_site_for(const LinearOptions& o, const ModuleFactory& f, int64_t out, int64_t in) {
  if (!f.fp8() || !o.fp8) return nullptr;
  return f.fp8()->add_site(o.init_name, layer_number(o.init_name), out, in);
}

void hold_wgrad(bool delay, const ModuleFactory& f, const torch::Tensor& weight, fp8::Fp8Site* site,
                const torch::Tensor& bias) {
  const auto& queue = f.main_grads()->wgrad_queue();
  if (!delay || !queue || !weight.defined()) return;
  f.main_grads()->hold_wgrad_of(weight);
  if (site) site->wgrad_queue = queue;
  else f.main_grads()->hold_wgrad_of(bias);  // no-op when undefined
}

}  // namespace fp8tron
