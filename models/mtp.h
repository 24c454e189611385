// Multi-token prediction (DeepSeek-V3; Megatron-Core's MultiTokenPredictionLayer with its state-dict
// names mtp.layers.<k>.{enorm, hnorm, eh_proj, transformer_layer.*, final_layernorm}). Depth k
// takes the previous depth's hidden states h (the decoder's, after its final norm, for k = 1) and
// the embedding of the input shifted k tokens left:
//   x = eh_proj([enorm(embedding) | hnorm(h)])      column-parallel, output gathered whole
//   h_k = final_layernorm(transformer_layer(x))     the layer as the decoder's last one: an
//                                                   MoE layer in an MoE model when that one is
//                                                   (mtp_layers_are_moe, core/config/model_config.h)
// and the shared output layer predicts token t + k + 1 from h_k (the loss is in gpt_model.cpp).
#pragma once
#include <torch/torch.h>

#include "models/gpt_model.h"

namespace fp8tron {

class MtpLayerImpl : public torch::nn::Module {
 public:
  // `moe`: the model's MoE context when the inner layer is an MoE layer (null: a dense layer). Its
  // router records its metrics as layer num_layers + depth, its auxiliary losses reach the
  // gradients as the decoder's do (not scaled by --mtp-loss-scaling-factor), as in Megatron.
  MtpLayerImpl(const ModelConfig& m, int64_t depth, const ModuleFactory& factory, std::shared_ptr<MoeContext> moe = nullptr);
  // embedded, hidden: [s(/tp under SP), b, H]; returns h_k in the same layout.
  torch::Tensor forward(const torch::Tensor& embedded, const torch::Tensor& hidden, const torch::Tensor& attention_mask);

  TELayerNorm enorm{nullptr}, hnorm{nullptr};
  TEColumnParallelLinear eh_proj{nullptr};
  TransformerLayer transformer_layer{nullptr};
  TELayerNorm final_layernorm{nullptr};

 private:
  TensorParallelContext tp_;
};
TORCH_MODULE(MtpLayer);

// Megatron's roll_tensor(shifts=-1) along the sequence of [b, s] tensors: every entry moves one
// position left and the last becomes 0.
torch::Tensor roll_left(const torch::Tensor& t);

}  // namespace fp8tron
