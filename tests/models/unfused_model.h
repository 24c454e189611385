// A whole GptModel's logits computed from its own modules the way the layers ran before the residual
// adds were fused into the norms (models/norm/residual_norm.h): every add a separate op in front of a
// norm that reads the whole sum, h = x + attention(norm(x)), out = h + mlp(norm(h)), then the final
// norm. Dropout is drawn in the same order as the model draws it, so with the same seed the two
// runs use the same masks. For the CPU tests (bitwise) and the GPU tests (within tolerances).
#pragma once
#include <torch/torch.h>

#include <functional>
#include <map>
#include <string>
#include <utility>

#include "models/gpt_model.h"
#include "models/attention/mla_attention.h"
#include "parallel/parallel_state.h"
#include "parallel/tensor_parallel.h"

namespace fp8tron::testing {

template <class Impl>
Impl& module_named(GptModelImpl& model, const std::string& name) {
  auto* m = dynamic_cast<Impl*>(model.named_modules()[name].get());
  if (m == nullptr) throw std::logic_error("no module " + name + " of the expected type");
  return *m;
}

// tokens [b, s] -> logits [b, s, padded vocab], as GptModelImpl::forward (one process, no TP).
inline torch::Tensor unfused_logits(GptModelImpl& model, const torch::Tensor& tokens) {
  const ModelConfig& m = model.config();
  namespace F = torch::nn::functional;
  auto dropout = [&](const torch::Tensor& x) {
    return m.hidden_dropout > 0 && model.is_training()
               ? F::dropout(x, F::DropoutFuncOptions().p(m.hidden_dropout).training(true))
               : x;
  };
  auto params = model.named_parameters();
  const auto word = params["embedding.word_embeddings.weight"];
  auto comm = make_self_communicator("tp", 0);
  auto h = vocab_parallel_embedding(tokens.t(), word, 0, *comm);
  if (const auto* table = params.find("embedding.position_embeddings.weight"))
    h = h + table->narrow(0, 0, tokens.size(1)).unsqueeze(1);
  h = dropout(h);
  for (int64_t i = 0; i < m.num_layers; ++i) {
    auto& layer = module_named<TransformerLayerImpl>(model, "decoder.layers." + std::to_string(i));
    const auto x = h;
    const auto attention = layer.mla_attention ? layer.mla_attention->forward(layer.input_layernorm(x), torch::Tensor())
                                               : layer.self_attention(x, torch::Tensor());
    h = x + dropout(attention);
    const auto mlp = layer.moe ? layer.moe(layer.pre_mlp_layernorm(h)) : layer.mlp(h);
    h = h + dropout(mlp);
  }
  h = module_named<TELayerNormImpl>(model, "decoder.final_layernorm").forward(h);
  auto& output = module_named<TEColumnParallelLinearImpl>(model, "output_layer");
  const auto logits = m.untie_embeddings_and_output_weights ? output.forward(h) : output.forward_with(h, word);
  return logits.transpose(0, 1);
}

// One forward (`forward`: the model's or unfused_logits) and backward of sum(logits x upstream)
// from zeroed gradients, with the dropout seed fixed so both runs draw the same masks: the logits
// and every parameter gradient by name.
inline std::pair<torch::Tensor, std::map<std::string, torch::Tensor>> logits_and_grads(
    GptModelImpl& model, const torch::Tensor& upstream, const std::function<torch::Tensor()>& forward) {
  model.zero_grad();
  torch::manual_seed(21);
  const auto logits = forward();
  (logits * upstream).sum().backward();
  std::map<std::string, torch::Tensor> grads;
  for (const auto& p : model.named_parameters())
    if (p.value().grad().defined()) grads[p.key()] = p.value().grad().clone();
  return {logits.detach(), grads};
}

}  // namespace fp8tron::testing
