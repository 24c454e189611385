// GPT in Megatron-Core's structure and parameter names:
//   embedding.{word,position}_embeddings.weight
//   decoder.layers.N.self_attention.{linear_qkv (norm fused), q_layernorm, k_layernorm, linear_proj}
//   decoder.layers.N.mlp.{linear_fc1 (norm fused), linear_fc2}
//   decoder.final_layernorm, output_layer (untied, or the last stage's copy of the tied embedding)
// N is the global layer number, so names are the same in every pipeline layout. One GptModel is
// one pipeline chunk: a run of layers, with the embedding on the first stage and the head (final
// norm, output layer, loss) on the last. Activations are [sequence, batch, hidden].
// The QKV projection uses Megatron's grouped layout: per query group, its query heads, then one
// key and one value head, so a tensor-parallel split keeps whole groups.
#pragma once
#include <torch/torch.h>

#include <functional>

#include "models/attention/core_attention.h"
#include "models/attention/rotary.h"
#include "models/linear/modules.h"
#include "models/moe/moe_layer.h"
#include "models/recompute/activation_offload.h"
#include "core/config/model_config.h"

namespace fp8tron {

class SelfAttentionImpl : public torch::nn::Module {
 public:
  SelfAttentionImpl(const ModelConfig& m, const std::string& prefix, const ModuleFactory& factory);
  // attention_mask: [b, 1, s, s] bool (true = may attend), or undefined for plain causal.
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& attention_mask);
  // forward() of the stream's sum, the pending add fused into linear_qkv's norm where it can be;
  // with defer_bias, linear_proj's bias left in out_bias where it can be
  // (TERowParallelLinear::forward_deferring_bias).
  ResidualOutput forward_residual(const ResidualStream& in, const torch::Tensor& attention_mask, bool defer_bias = false);

  TELayerNormColumnParallelLinear linear_qkv{nullptr};
  TELayerNorm q_layernorm{nullptr}, k_layernorm{nullptr};
  TERowParallelLinear linear_proj{nullptr};

 private:
  // Attention from the QKV projection's output on.
  DeferredBiasOutput attend(const torch::Tensor& qkv, const torch::Tensor& attention_mask, bool defer_bias);

  ModelConfig config_;
  int64_t local_heads_, local_groups_;
  RotaryEmbedding rope_;
  CoreAttention core_attention_;
  // --offload-modules core_attn / attn_proj (models/recompute/activation_offload.h); null: kept.
  ActivationOffloader* offload_core_ = nullptr;
  ActivationOffloader* offload_proj_ = nullptr;
};
TORCH_MODULE(SelfAttention);

class MlpImpl : public torch::nn::Module {
 public:
  MlpImpl(const ModelConfig& m, const std::string& prefix, const ModuleFactory& factory);
  torch::Tensor forward(const torch::Tensor& x);
  // forward() of the stream's sum, the pending add fused into linear_fc1's norm where it can be;
  // with defer_bias, linear_fc2's bias left in out_bias where it can be (the fused GeLU MLP).
  ResidualOutput forward_residual(const ResidualStream& in, bool defer_bias = false);
  // How the activation runs between fc1 and fc2 (--print-model-plan).
  std::string describe_plan() const;

  TELayerNormColumnParallelLinear linear_fc1{nullptr};
  TERowParallelLinear linear_fc2{nullptr};

 private:
  DeferredBiasOutput activation_and_fc2(const torch::Tensor& fc1_out, bool defer_bias);

  // The fused bf16 GeLU MLP (models/mlp/fused_gelu_mlp.h, TERowParallelLinear::
  // forward_fused_gelu_mlp): planned when the MLP is built; runs where the tensors fit (x: the
  // MLP's input; the kernels need a GPU, bf16 and fp32 main gradients).
  bool fused_gelu_applies(const torch::Tensor& x) const;
  bool swiglu_, squared_relu_, bias_gelu_fusion_;
  bool fused_gelu_mlp_ = false;
};
TORCH_MODULE(Mlp);

class MlaSelfAttentionImpl;

// A dense layer's MLP carries its norm fused into linear_fc1; an MoE layer (--moe-layer-freq) has
// a separate pre_mlp_layernorm and the MoeLayer registered as "mlp" (Megatron's MoE layer spec).
// Each residual add is fused into the norm that reads its sum (models/norm/residual_norm.h): x +
// attention into the MLP's norm, and the layer's last add, h + mlp, into the next layer's input
// norm (or the decoder's final norm), so a layer hands its output on as a ResidualStream whose
// branch is still to be added.
class TransformerLayerImpl : public torch::nn::Module {
 public:
  // `layer`: the global 0-based layer number; `moe`: the model's MoE context (MoE layers only).
  // A decoder layer is an MoE layer when --moe-layer-freq says so.
  TransformerLayerImpl(const ModelConfig& m, const std::string& prefix, int64_t layer, const ModuleFactory& factory,
                       std::shared_ptr<MoeContext> moe = nullptr);
  // A layer whose kind the caller decides (the MTP layers' inner layer): an MoE layer when
  // `moe_mlp`, recording its MoE metrics under index `layer`.
  TransformerLayerImpl(const ModelConfig& m, const std::string& prefix, int64_t layer, const ModuleFactory& factory,
                       std::shared_ptr<MoeContext> moe, bool moe_mlp);
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& attention_mask = {});
  // The layer on a stream whose last add may still be pending (added by this layer's input norm);
  // its output's last add, h + mlp, is left pending in turn: forward() is forward_stream().sum().
  ResidualStream forward_stream(const ResidualStream& in, const torch::Tensor& attention_mask = {});

  SelfAttention self_attention{nullptr};
  // Multi-latent attention (registered as "self_attention" too) with its own input_layernorm.
  std::shared_ptr<MlaSelfAttentionImpl> mla_attention;
  TELayerNorm input_layernorm{nullptr};
  Mlp mlp{nullptr};
  TELayerNorm pre_mlp_layernorm{nullptr};  // MoE layers
  MoeLayer moe{nullptr};                   // MoE layers (named "mlp")

 private:
  // consumer(norm(stream's sum)) for a norm that is a module of its own (MLA's input norm, an MoE
  // layer's pre-MLP norm), the pending add fused into the norm. With --recompute-modules layernorm
  // the sum is formed first and the norm's output is discarded once `consumer` has run and
  // recomputed in backward (models/recompute/output_discarding_recompute.h).
  ResidualOutput normed(TELayerNorm& norm, const ResidualStream& in,
                        const std::function<torch::Tensor(const torch::Tensor&)>& consumer);
  // With defer_bias the output projection's bias may come back pending (out_bias).
  ResidualOutput attention(const ResidualStream& in, const torch::Tensor& attention_mask, bool defer_bias);
  ResidualOutput mlp_or_moe(const ResidualStream& in, bool defer_bias);
  // The stream a sub-layer's output continues: its bias pending where it came back so, else after
  // the hidden dropout.
  ResidualStream continue_stream(const ResidualOutput& sub_layer);

  double hidden_dropout_;
  MainGradsPtr main_grads_;
  bool recompute_mlp_ = false;        // --recompute-modules mlp
  bool recompute_layernorm_ = false;  // --recompute-modules layernorm
  // --offload-modules (models/recompute/activation_offload.h): the model's offloader, and the
  // module name each offloaded residual sum is counted under ("": kept on the device).
  ActivationOffloader* offloader_ = nullptr;
  std::string offload_attn_input_;  // attn_norm or qkv_linear: the layer's input sum x
  std::string offload_qkv_input_;   // qkv_linear where the QKV input is a tensor of its own (MLA)
  std::string offload_mlp_input_;   // mlp_norm: h = x + attention
};
TORCH_MODULE(TransformerLayer);

class MtpLayerImpl;

// Which part of the model a pipeline chunk holds.
struct StageSpec {
  int64_t first_layer = 0;
  int64_t num_layers = 0;
  bool has_embedding = true;  // first stage
  bool has_head = true;       // last stage
  static StageSpec whole(const ModelConfig& m) { return StageSpec{0, m.num_layers, true, true}; }
};

class GptModelImpl : public torch::nn::Module {
 public:
  // `fp8`: the engine the chunk's linear layers register with (null: bf16 GEMMs). `moe`: the MoE
  // state shared by the model's chunks (its groups, aux-loss scale, metrics); null in an MoE
  // model builds a single-process one. `cp`: context parallelism (inputs are then this rank's
  // sequence shards, models/attention/context_parallel_attention.h). `main_grads`: how the
  // kernels treat the fp32 main gradients (models/linear/main_grads.h; a model of its own, fusion
  // on, by default).
  GptModelImpl(const ModelConfig& m, const TensorParallelContext& tp, const StageSpec& stage,
               std::shared_ptr<fp8::Fp8Engine> fp8 = nullptr, std::shared_ptr<MoeContext> moe = nullptr,
               ContextParallelContext cp = {}, MainGradsPtr main_grads = make_main_grads());
  explicit GptModelImpl(const ModelConfig& m);  // whole model, one process

  // One pipeline chunk: tokens [b, s] (first stage) or hidden states from the previous stage in,
  // hidden states out, or on the last stage the mean loss over loss_mask (labels/mask [b, s]).
  // position_ids [b, s] (--reset-position-ids, learned positions) and segment_ids [b, s]
  // (--reset-attention-mask: no attention across documents) are optional. With multi-token
  // prediction the last stage also takes the tokens [b, s] (its input is hidden states): the
  // returned loss then carries the MTP losses' gradients while its value stays the main loss.
  // With set_per_token_loss(true) the loss is the sum over loss tokens instead of their mean.
  torch::Tensor forward_stage(const torch::Tensor& input, const torch::Tensor& labels, const torch::Tensor& loss_mask,
                              const torch::Tensor& position_ids = {}, const torch::Tensor& segment_ids = {},
                              const torch::Tensor& tokens = {});
  // --calculate-per-token-loss: the last stage returns summed (not averaged) token losses.
  void set_per_token_loss(bool on) { per_token_loss_ = on; }
  // Multi-token prediction: each depth's loss (sum over tokens / tokens; under context parallelism
  // this shard's sum over the micro-batch's tokens, to be summed over the ranks) summed over the training
  // micro-batches since the last call (0-dim fp32 tensors on the device), and how many
  // micro-batches that was. Empty without MTP or on a stage without the loss.
  std::vector<torch::Tensor> take_mtp_losses(int64_t* micro_batches);
  // Whole model, one tensor-parallel rank: mean cross entropy (fp32) where loss_mask is 1.
  torch::Tensor loss(const torch::Tensor& tokens, const torch::Tensor& labels, const torch::Tensor& loss_mask);
  // Whole model without tensor parallelism: logits [b, s, padded_vocab].
  torch::Tensor forward(const torch::Tensor& tokens);

  const ModelConfig& config() const { return config_; }
  const StageSpec& stage() const { return stage_; }
  const std::shared_ptr<MoeContext>& moe_context() const { return moe_; }
  const MainGradsPtr& main_grads() const { return main_grads_; }
  // --fine-grained-activation-offloading: the chunk's offloader (its byte counters); null when off.
  const std::shared_ptr<ActivationOffloader>& offloader() const { return offloader_; }
  std::map<std::string, ParamInfo> param_infos() const { return collect_param_infos(*this); }
  // The tied word embedding (first stage) or its last-stage copy; undefined if untied.
  torch::Tensor shared_embedding_weight() const;
  // Called with each part of the chunk (the embedding, every layer, the head) just before the
  // forward pass first reads its parameters: --overlap-param-gather waits there for the
  // data-parallel all-gather of those weights.
  using ParamsReadyHook = std::function<void(const torch::nn::Module&)>;
  void set_params_ready_hook(ParamsReadyHook hook) { params_ready_ = std::move(hook); }
  // Called with each part right after its forward pass, with the tensors it produced: Megatron-FSDP's
  // sharded weights (--data-parallel-sharding-strategy optim_grads_params) are released there, and
  // gathered again when the first gradient reaches those tensors.
  using ParamsUsedHook = std::function<void(const torch::nn::Module&, const std::vector<torch::Tensor>&)>;
  void set_params_used_hook(ParamsUsedHook hook) { params_used_ = std::move(hook); }
  // --defer-embedding-wgrad-compute on the stage with the output layer: the weight gradients of
  // the first `limit` training micro-batches of a step (0: all) wait for drain_output_wgrad(),
  // called after the step's pipeline schedule (models/linear/wgrad_deferral.h).
  void defer_output_wgrad(int64_t limit);
  void drain_output_wgrad();

 private:
  torch::Tensor embed(const torch::Tensor& tokens, const torch::Tensor& position_ids);  // [b, s] -> [s(/tp), b, h]
  // The chunk's layers, with full recomputation by recompute units when it is on. The last layer's
  // last add is left pending (a recompute unit's output is whole).
  ResidualStream run_layers(const torch::Tensor& h, const torch::Tensor& attention_mask);
  // The decoder's final norm of the stream's sum, its pending add fused in.
  torch::Tensor final_norm(const ResidualStream& in);
  torch::Tensor output_logits(const torch::Tensor& normed);  // the output layer (tied or not)
  torch::Tensor word_embedding_weight() const;  // the embedding or this stage's copy of it
  // Token losses [s, b] of the logits against labels [b, s].
  torch::Tensor token_losses(const torch::Tensor& logits, const torch::Tensor& labels);
  // The multi-token-prediction part of the loss (zero-valued, carrying the MTP gradients).
  torch::Tensor mtp_loss(const torch::Tensor& hidden, const torch::Tensor& tokens, const torch::Tensor& labels,
                         const torch::Tensor& loss_mask, const torch::Tensor& position_ids,
                         const torch::Tensor& attention_mask);
  // A token count of this rank's shard as the micro-batch's: summed over the context-parallel
  // ranks (detached), or `local` itself without context parallelism.
  torch::Tensor micro_batch_count(const torch::Tensor& local) const;
  void params_ready(const torch::nn::Module& part) const {
    if (params_ready_) params_ready_(part);
  }
  void params_used(const torch::nn::Module& part, const std::vector<torch::Tensor>& outputs) const {
    if (params_used_) params_used_(part, outputs);
  }

  ModelConfig config_;
  TensorParallelContext tp_;
  ContextParallelContext cp_;
  StageSpec stage_;
  std::shared_ptr<MoeContext> moe_;
  MainGradsPtr main_grads_;
  std::shared_ptr<ActivationOffloader> offloader_;
  ParamsReadyHook params_ready_;
  ParamsUsedHook params_used_;
  std::shared_ptr<torch::nn::Module> embedding_;
  std::shared_ptr<ShardedModule> word_embeddings_, position_embeddings_;
  std::vector<TransformerLayer> layers_;
  TELayerNorm final_layernorm_{nullptr};
  bool final_norm_here_ = false;  // the chunk applies decoder.final_layernorm after its layers
  TEColumnParallelLinear output_layer_{nullptr};
  // The word embedding's copy on a last stage without the embedding (the tied output layer, or
  // the input of the MTP layers).
  std::shared_ptr<ShardedModule> output_copy_;
  std::vector<std::shared_ptr<MtpLayerImpl>> mtp_layers_;
  bool per_token_loss_ = false;
  std::vector<torch::Tensor> mtp_loss_sums_;
  int64_t mtp_micro_batches_ = 0;
};
TORCH_MODULE(GptModel);

// Which fused attention backend ATen picks for these shapes (logged once at start).
std::string attention_backend_name(const ModelConfig& m, int64_t micro_batch, torch::Device device, torch::Dtype dtype);

// Prefers cuDNN attention on GPU (1.9x the flash path on an H200), flash as fallback.
void configure_attention_backends();

}  // namespace fp8tron
