#include "models/moe/shared_experts.h"

#include <cmath>

#include "models/init_methods.h"

namespace fp8tron {

SharedExpertMlpImpl::SharedExpertMlpImpl(const ModelConfig& m, const std::string& prefix, const ModuleFactory& f)
    : swiglu_(m.swiglu) {
  const int64_t size = m.moe.shared_expert_size;
  LinearOptions fc1{m.hidden_size, m.swiglu ? 2 * size : size, false, hidden_init_std(m), m.swiglu ? 2 : 1,
                    prefix + ".linear_fc1"};
  LinearOptions fc2{size, m.hidden_size, false, output_layer_init_std(m), 1,
                    prefix + ".linear_fc2"};
  linear_fc1 = register_module("linear_fc1", TEColumnParallelLinear(fc1, f));
  linear_fc2 = register_module("linear_fc2", TERowParallelLinear(fc2, f));
  if (m.moe.shared_expert_gate) {
    // Replicated; each sequence shard's tokens give a partial gradient under SP.
    ParamInfo info;
    info.global_shape = {1, m.hidden_size};
    info.reduce_grad_over_tp = f.tp().sequence_parallel && f.tp().size > 1;
    gate_weight = add_param("gate_weight", f.normal(prefix + ".gate_weight", info, hidden_init_std(m)), info);
  }
}

torch::Tensor SharedExpertMlpImpl::forward(const torch::Tensor& x) {
  auto h = linear_fc1(x);
  auto out = (swiglu_ ? linear_fc2->forward_swiglu(h) : linear_fc2->forward_gelu(h)).out;
  if (gate_weight.defined()) out = out * torch::sigmoid(torch::nn::functional::linear(x, gate_weight));
  return out;
}

}  // namespace fp8tron
