#include "models/mtp.h"

#include "models/init_methods.h"
#include "parallel/tensor_parallel.h"

namespace fp8tron {

MtpLayerImpl::MtpLayerImpl(const ModelConfig& m, int64_t depth, const ModuleFactory& f, std::shared_ptr<MoeContext> moe)
    : tp_(f.tp()) {
  const std::string prefix = "mtp.layers." + std::to_string(depth);
  // Under SP the norms run on sequence shards: partial gradients per rank.
  const bool sp = f.tp().sequence_parallel;
  enorm = register_module("enorm", TELayerNorm(NormOptions::from(m, m.hidden_size), sp, f));
  hnorm = register_module("hnorm", TELayerNorm(NormOptions::from(m, m.hidden_size), sp, f));
  eh_proj = register_module(
      "eh_proj", TEColumnParallelLinear(LinearOptions{2 * m.hidden_size, m.hidden_size, false, hidden_init_std(m), 1,
                                                      prefix + ".eh_proj"},
                                        f));
  // Megatron numbers the MTP layers' MoE metrics after the decoder's layers.
  const bool moe_mlp = moe != nullptr;
  transformer_layer = register_module(
      "transformer_layer", TransformerLayer(m, prefix + ".transformer_layer", m.num_layers + depth, f, std::move(moe), moe_mlp));
  final_layernorm = register_module("final_layernorm", TELayerNorm(NormOptions::from(m, m.hidden_size), sp, f));
}

torch::Tensor MtpLayerImpl::forward(const torch::Tensor& embedded, const torch::Tensor& hidden,
                                    const torch::Tensor& attention_mask) {
  // The embedding half first, as Megatron concatenates them.
  auto x = eh_proj(torch::cat({enorm(embedded), hnorm(hidden)}, -1));  // [s, b, H/tp]
  x = gather_from_tp_last_dim(x, *tp_.comm);
  if (tp_.sequence_parallel) x = scatter_to_sp(x, *tp_.comm);
  return final_layernorm->forward_residual(transformer_layer->forward_stream({x, {}}, attention_mask)).normed;
}

torch::Tensor roll_left(const torch::Tensor& t) {
  auto out = torch::zeros_like(t);
  const int64_t s = t.size(1);
  out.narrow(1, 0, s - 1).copy_(t.narrow(1, 1, s - 1));
  return out;
}

}  // namespace fp8tron
