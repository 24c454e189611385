#include "models/gpt_model.h"

#include <ATen/SDPBackend.h>

#include <cmath>
#include <utility>

#include "core/error.h"
#include "models/attention/mla_attention.h"
#include "models/mtp.h"
#include "models/loss/cross_entropy.h"
#include "models/embedding/embedding.h"
#include "models/init_methods.h"
#include "models/recompute/output_discarding_recompute.h"
#include "models/attention/output_gate.h"
#include "models/attention/qkv_split.h"
#include "models/recompute/recompute.h"
#include "parallel/parallel_state.h"
#include "parallel/tensor_parallel.h"

namespace fp8tron {
namespace {
namespace F = torch::nn::functional;

torch::Tensor maybe_dropout(const torch::Tensor& x, double p, bool training) {
  return p > 0 && training ? F::dropout(x, F::DropoutFuncOptions().p(p).training(true)) : x;
}

// The rotary embedding of standard attention: rope on --rotary-percent of each head (with
// --use-rope-scaling's Llama 3.1 frequencies), or YaRN on the whole head (Megatron's YaRN ignores
// --rotary-percent); none for learned or no positions.
RotarySpec attention_rotary(const ModelConfig& m) {
  RotarySpec spec;
  spec.base = m.rotary_base;
  spec.layout = m.rotary.interleaved ? RotaryLayout::Interleaved : RotaryLayout::RotateHalf;
  spec.fused = m.rotary.fused;
  if (m.position_embedding == PositionEmbedding::Rope) {
    spec.dim = int64_t(double(m.kv_channels) * m.rotary_percent);
    if (m.rotary.llama3_scaling) {
      spec.scaling = RotaryScaling::Llama3;
      spec.llama3_factor = m.rotary.llama3_factor;
    }
  } else if (m.position_embedding == PositionEmbedding::Yarn) {
    spec.dim = m.kv_channels;
    spec.scaling = RotaryScaling::Yarn;
    spec.yarn = m.rotary.yarn;
  }
  return spec;
}

TensorParallelContext no_tensor_parallel() {
  TensorParallelContext tp;
  tp.comm = make_self_communicator("tp", 0);
  return tp;
}
}  // namespace

// ---- attention -----------------------------------------------------------------------------------
SelfAttentionImpl::SelfAttentionImpl(const ModelConfig& m, const std::string& prefix, const ModuleFactory& f)
    : config_(m),
      local_heads_(m.num_attention_heads / f.tp().size),
      local_groups_(m.num_query_groups / f.tp().size) {
  const int64_t q = m.num_attention_heads * m.kv_channels, kv = m.num_query_groups * m.kv_channels;
  const int64_t gates = m.attention_output_gate ? q : 0;
  linear_qkv = register_module(
      "linear_qkv", TELayerNormColumnParallelLinear(NormOptions::from(m, m.hidden_size),
                                                    LinearOptions{m.hidden_size, q + gates + 2 * kv, m.add_qkv_bias,
                                                                  hidden_init_std(m), 1, prefix + ".linear_qkv"},
                                                    f));
  if (m.qk_layernorm) {
    // Each tensor-parallel rank normalises its own heads: gradients are partial per rank.
    q_layernorm = register_module("q_layernorm", TELayerNorm(NormOptions::from(m, m.kv_channels), true, f));
    k_layernorm = register_module("k_layernorm", TELayerNorm(NormOptions::from(m, m.kv_channels), true, f));
  }
  linear_proj = register_module(
      "linear_proj",
      TERowParallelLinear(LinearOptions{q, m.hidden_size, m.add_bias_linear, output_layer_init_std(m), 1, prefix + ".linear_proj",
                                        false, true, /*defer_bias=*/true},
                          f));
  // Under context parallelism the tokens are this rank's shard: their own positions.
  const auto& cp = f.cp();
  const torch::Tensor positions = cp.enabled() ? cp_positions(m.seq_length, cp.size(), cp.rank()) : torch::Tensor();
  rope_ = RotaryEmbedding(attention_rotary(m), positions);
  core_attention_ = CoreAttention(m, per_layer_index(prefix), cp, f.fp8(), prefix + ".core_attention");
  if (m.offload.on(&OffloadModules::core_attn)) offload_core_ = f.offloader().get();
  if (m.offload.on(&OffloadModules::attn_proj)) offload_proj_ = f.offloader().get();
}

torch::Tensor SelfAttentionImpl::forward(const torch::Tensor& x, const torch::Tensor& attention_mask) {
  return attend(linear_qkv(x), attention_mask, false).out;
}

ResidualOutput SelfAttentionImpl::forward_residual(const ResidualStream& in, const torch::Tensor& attention_mask,
                                                   bool defer_bias) {
  const auto qkv = linear_qkv->forward_residual(in);
  const auto y = attend(qkv.out, attention_mask, defer_bias);
  return {qkv.sum, y.out, y.bias};
}

// qkv: [s, b, local (q + 2 kv)], or [s, b, local (2 q + 2 kv)] with the output gate.
DeferredBiasOutput SelfAttentionImpl::attend(const torch::Tensor& qkv, const torch::Tensor& attention_mask,
                                             bool defer_bias) {
  const auto& m = config_;
  const int64_t s = qkv.size(0), b = qkv.size(1), d = m.kv_channels;
  const int64_t per_group = local_heads_ / local_groups_;
  // One split whose backward writes one gradient (three narrow/select views would each scatter their
  // gradient into a zero-filled copy of qkv, to be summed).
  const bool gated = m.attention_output_gate;
  auto parts = split_qkv(qkv.view({s, b, local_groups_, (gated ? 2 * per_group : per_group) + 2, d}), per_group, gated);
  auto q = parts[0];  // [s, b, groups, per_group, d]
  auto k = parts[1];  // [s, b, groups, d]
  auto v = parts[2];
  if (m.qk_layernorm) {
    q = q_layernorm(q.reshape({s, b, local_heads_, d}));
    k = k_layernorm(k);
  }
  if (rope_.enabled()) {
    q = rope_.apply(q);  // reads the grouped query view in place on the GPU
    k = rope_.apply(k);
  } else {
    q = q.reshape({s, b, local_heads_, d});
  }
  const double p = is_training() ? m.attention_dropout : 0.0;
  // --offload-modules core_attn: q, k and v wait on the host (the output gate, which may share
  // their memory, is read after the attention).
  auto out = offloaded_call(
      offload_core_, "core_attn", {q, k, v}, [&] { return core_attention_.forward(q, k, v, attention_mask, p, is_training()); },
      {gated ? parts[3] : torch::Tensor()});
  if (gated) out = apply_output_gate(out, parts[3]);
  if (!offload_proj_) {
    // The projection's FP8 input is cast again from the attention's output where the attention
    // keeps it for its own backward (offloaded, it waits on the host; gated, it is a new tensor).
    const bool held = !gated && !offload_core_ && core_attention_.keeps_output();
    return linear_proj->forward_deferring_bias(out, defer_bias, held ? fp8::InputRebuild([out = out.detach()] { return out; })
                                                                     : fp8::InputRebuild());
  }
  // --offload-modules attn_proj: the projection's input (core attention's output).
  const auto group = offload_proj_->begin("attn_proj", {out});
  auto y = linear_proj->forward_deferring_bias(out, defer_bias);
  offload_proj_->after(group, y.out);
  offload_proj_->offload(group);
  return y;
}

// ---- MLP -------------------------------------------------------------------------------------------
MlpImpl::MlpImpl(const ModelConfig& m, const std::string& prefix, const ModuleFactory& f)
    : swiglu_(m.swiglu), squared_relu_(m.squared_relu), bias_gelu_fusion_(m.bias_gelu_fusion) {
  const int64_t fc1_out = m.swiglu ? 2 * m.ffn_hidden_size : m.ffn_hidden_size;
  linear_fc1 = register_module(
      "linear_fc1", TELayerNormColumnParallelLinear(NormOptions::from(m, m.hidden_size),
                                                    LinearOptions{m.hidden_size, fc1_out, m.add_bias_linear, hidden_init_std(m),
                                                                  m.swiglu ? 2 : 1, prefix + ".linear_fc1"},
                                                    f));
  linear_fc2 = register_module(
      "linear_fc2", TERowParallelLinear(LinearOptions{m.ffn_hidden_size, m.hidden_size, m.add_bias_linear, output_layer_init_std(m), 1,
                                                      prefix + ".linear_fc2", false, true, /*defer_bias=*/true},
                                        f));
  // The bf16 GeLU MLP as one op (fc1's GEMM with its bias and the GeLU, fc2's GEMM; its norm too on
  // one rank) where both linears run the plain path, unless --no-bias-gelu-fusion.
  fused_gelu_mlp_ = m.bias_gelu_fusion && !m.swiglu && !m.squared_relu && linear_fc1->plan().path == LinearPath::kPlain &&
                    linear_fc2->plan().path == LinearPath::kPlain;
}

std::string MlpImpl::describe_plan() const {
  if (fused_gelu_mlp_) return "fc1 + GeLU + fc2 as one op (the fused GeLU MLP), its norm in it on one rank";
  if (squared_relu_) return "squared ReLU between fc1 and fc2 (torch's ops)";
  const bool fp8 = linear_fc2->plan().fp8();
  if (swiglu_) return fp8 ? "SwiGLU fused into fc2's FP8 input cast" : "SwiGLU kernel (with fc2 in one op on one rank)";
  return fp8 ? "GeLU fused into fc2's FP8 input cast" : "GeLU (torch's op) between fc1 and fc2";
}

torch::Tensor MlpImpl::forward(const torch::Tensor& x) {
  if (fused_gelu_applies(x)) {
    const ResidualStream stream{x, {}};
    if (const auto norm = linear_fc1->fusable_norm(stream))
      return linear_fc2->forward_fused_norm_gelu_mlp(stream, *norm, linear_fc1->weight, linear_fc1->bias, false).out;
    return linear_fc2->forward_fused_gelu_mlp(linear_fc1->gemm_input(x), linear_fc1->weight, linear_fc1->bias, false).out;
  }
  return activation_and_fc2(linear_fc1(x), false).out;
}

ResidualOutput MlpImpl::forward_residual(const ResidualStream& in, bool defer_bias) {
  if (fused_gelu_applies(in.residual)) {
    // fc1's norm in the MLP's op where one rank runs it (no normed input kept for the backward).
    if (const auto norm = linear_fc1->fusable_norm(in))
      return linear_fc2->forward_fused_norm_gelu_mlp(in, *norm, linear_fc1->weight, linear_fc1->bias, defer_bias);
    const auto g = linear_fc1->gemm_input_residual(in);
    const auto y = linear_fc2->forward_fused_gelu_mlp(g.out, linear_fc1->weight, linear_fc1->bias, defer_bias);
    return {g.sum, y.out, y.bias};
  }
  const auto fc1 = linear_fc1->forward_residual(in);
  const auto y = activation_and_fc2(fc1.out, defer_bias);
  return {fc1.sum, y.out, y.bias};
}

DeferredBiasOutput MlpImpl::activation_and_fc2(const torch::Tensor& h, bool defer_bias) {
  // GeLU (tanh, as Megatron and TE) or SwiGLU on this rank's gate|up shards, fused into FP8 casts
  // (in bf16, GeLU with fc1's bias runs in the GEMMs' epilogues where it can: the callers take that
  // path first); squared ReLU (Megatron's torch.pow(F.relu(x), 2)) unfused.
  if (squared_relu_) return linear_fc2->forward_deferring_bias(torch::relu(h).square(), defer_bias);
  return swiglu_ ? linear_fc2->forward_swiglu(h, defer_bias) : linear_fc2->forward_gelu(h, defer_bias);
}

bool MlpImpl::fused_gelu_applies(const torch::Tensor& x) const {
  // The norm and the all-gather keep x's dtype, device and width: x stands for fc1's GEMM input.
  return fused_gelu_mlp_ && linear_fc2->fused_gelu_mlp_applies(x, linear_fc1->weight, linear_fc1->bias);
}

// ---- layer -------------------------------------------------------------------------------------------
TransformerLayerImpl::TransformerLayerImpl(const ModelConfig& m, const std::string& prefix, int64_t layer,
                                           const ModuleFactory& f, std::shared_ptr<MoeContext> moe_context)
    : TransformerLayerImpl(m, prefix, layer, f, std::move(moe_context), m.moe.is_moe_layer(layer)) {}

TransformerLayerImpl::TransformerLayerImpl(const ModelConfig& m, const std::string& prefix, int64_t layer,
                                           const ModuleFactory& f, std::shared_ptr<MoeContext> moe_context, bool moe_mlp)
    : hidden_dropout_(m.hidden_dropout),
      main_grads_(f.main_grads()),
      recompute_mlp_(m.recompute.selective(&RecomputeModules::mlp)),
      recompute_layernorm_(m.recompute.selective(&RecomputeModules::layernorm)) {
  if (m.offload.enabled) {
    offloader_ = f.offloader().get();
    // The layer's input sum is what the input norm keeps; fused with linear_qkv (no MLA) it is
    // also all the QKV projection keeps of its input (the normed input is formed again in backward).
    const OffloadConfig& o = m.offload;
    if (o.modules.attn_norm) offload_attn_input_ = "attn_norm";
    else if (o.modules.qkv_linear && !m.mla.enabled) offload_attn_input_ = "qkv_linear";
    if (o.modules.qkv_linear && m.mla.enabled) offload_qkv_input_ = "qkv_linear";
    if (o.modules.mlp_norm) offload_mlp_input_ = "mlp_norm";
  }
  if (m.mla.enabled) {
    // MLA's input norm is a module of its own (its down projections are not norm-fused linears);
    // under SP it runs on sequence shards (partial gradients).
    input_layernorm = register_module("input_layernorm", TELayerNorm(NormOptions::from(m, m.hidden_size),
                                                                      f.tp().sequence_parallel, f));
    mla_attention = register_module("self_attention", std::make_shared<MlaSelfAttentionImpl>(m, prefix + ".self_attention", f));
  } else {
    self_attention = register_module("self_attention", SelfAttention(m, prefix + ".self_attention", f));
  }
  if (!moe_mlp) {
    mlp = register_module("mlp", Mlp(m, prefix + ".mlp", f));
    return;
  }
  FP8TRON_CHECK(moe_context != nullptr, "an MoE layer needs the model's MoE context");
  // Under SP the norm runs on sequence shards: partial gradients per rank.
  pre_mlp_layernorm =
      register_module("pre_mlp_layernorm", TELayerNorm(NormOptions::from(m, m.hidden_size), f.tp().sequence_parallel, f));
  moe = register_module("mlp", MoeLayer(m, prefix + ".mlp", layer, f, std::move(moe_context)));
}

ResidualOutput TransformerLayerImpl::normed(TELayerNorm& norm, const ResidualStream& in,
                                            const std::function<torch::Tensor(const torch::Tensor&)>& consumer) {
  if (!recompute_layernorm_ || !is_training()) {
    const auto r = norm->forward_residual(in);
    return {r.sum, consumer(r.normed)};
  }
  const auto x = in.sum(main_grads_);
  OutputDiscardingRecompute checkpoint;
  // Called again in backward: captures the module holder (the model outlives its graphs).
  auto y = checkpoint.run_one([norm](const torch::Tensor& in) mutable { return norm(in); }, x);
  auto out = consumer(y);
  checkpoint.discard(out);
  return {x, out};
}

ResidualOutput TransformerLayerImpl::attention(const ResidualStream& in, const torch::Tensor& attention_mask,
                                               bool defer_bias) {
  if (mla_attention) {
    // --offload-modules qkv_linear: the down projections' input (the normed x), unless
    // --recompute-modules layernorm discards it (nothing then stays to offload).
    auto* offloader = offload_qkv_input_.empty() || recompute_layernorm_ ? nullptr : offloader_;
    return normed(input_layernorm, in, [&](const torch::Tensor& y) {
      return offloaded_call(offloader, offload_qkv_input_, {y}, [&] { return mla_attention->forward(y, attention_mask); });
    });
  }
  return self_attention->forward_residual(in, attention_mask, defer_bias);
}

ResidualOutput TransformerLayerImpl::mlp_or_moe(const ResidualStream& in, bool defer_bias) {
  if (moe) return normed(pre_mlp_layernorm, in, [this](const torch::Tensor& y) { return moe(y); });
  if (!recompute_mlp_ || !is_training()) return mlp->forward_residual(in, defer_bias);
  // --recompute-modules mlp: only the MLP's input is kept (the module outlives its graphs), so its
  // norm stays inside the recomputed function and the add runs first.
  const auto h = in.sum(main_grads_);
  return {h, recompute([this](const std::vector<torch::Tensor>& x) { return mlp(x[0]); }, {h})};
}

ResidualStream TransformerLayerImpl::continue_stream(const ResidualOutput& sub_layer) {
  if (sub_layer.out_bias.defined()) return {sub_layer.sum, sub_layer.out, sub_layer.out_bias};
  return {sub_layer.sum, maybe_dropout(sub_layer.out, hidden_dropout_, is_training())};
}

ResidualStream TransformerLayerImpl::forward_stream(const ResidualStream& in, const torch::Tensor& attention_mask) {
  // Megatron's bias-dropout-add: without a dropout to apply, the output projections' biases are
  // added in the next norm's kernel (ResidualStream::branch_bias); with one, before it.
  const bool defer_bias = !(hidden_dropout_ > 0 && is_training());
  const auto a = attention(in, attention_mask, defer_bias);            // a.sum: the layer's input x
  std::shared_ptr<OffloadGroup> x_group, h_group;
  if (offloader_) {
    offloader_->offload_deferred();  // the earlier layer's h: its last add has run in this layer's input norm
    // x and h are read once more by the next add (fused into the next norm): offloaded after it.
    if (!offload_attn_input_.empty()) x_group = offloader_->begin(offload_attn_input_, {a.sum});
    offloader_->after(x_group, a.out);
  }
  const auto m = mlp_or_moe(continue_stream(a), defer_bias);           // m.sum: h = x + attention
  if (offloader_) {
    offloader_->offload(x_group);
    if (!offload_mlp_input_.empty()) h_group = offloader_->begin(offload_mlp_input_, {m.sum});
    offloader_->after(h_group, m.out);
    offloader_->defer(h_group);
  }
  return continue_stream(m);
}

torch::Tensor TransformerLayerImpl::forward(const torch::Tensor& x, const torch::Tensor& attention_mask) {
  return forward_stream({x, {}}, attention_mask).sum(main_grads_);
}

// ---- model -------------------------------------------------------------------------------------------
GptModelImpl::GptModelImpl(const ModelConfig& m) : GptModelImpl(m, no_tensor_parallel(), StageSpec::whole(m)) {}

GptModelImpl::GptModelImpl(const ModelConfig& m, const TensorParallelContext& tp, const StageSpec& stage,
                           std::shared_ptr<fp8::Fp8Engine> fp8, std::shared_ptr<MoeContext> moe, ContextParallelContext cp,
                           MainGradsPtr main_grads)
    : config_(m), tp_(tp), cp_(std::move(cp)), stage_(stage), moe_(std::move(moe)), main_grads_(std::move(main_grads)) {
  ModuleFactory f(m.seed, tp, std::move(fp8), cp_, main_grads_);
  if (m.offload.enabled) {
    offloader_ = std::make_shared<ActivationOffloader>(m.offload.min_tensor_size);
    f.set_offloader(offloader_);
  }
  if (m.moe.enabled() && !moe_) {
    FP8TRON_CHECK(tp.size == 1, "a tensor-parallel MoE model needs its MoE context (the expert-parallel groups)");
    moe_ = std::make_shared<MoeContext>(m.moe, moe_metric_layers(m), ExpertParallelGroups::single_process());
  }
  const bool tied = !m.untie_embeddings_and_output_weights;
  const bool mtp = m.mtp.num_layers > 0;
  ParamInfo word;
  word.global_shape = {m.padded_vocab_size, m.hidden_size};
  word.partition_dim = 0;  // vocabulary-parallel
  // Shared with the last stage: as the tied output layer, or as the MTP layers' input embedding.
  word.tied_embedding = tied || mtp;
  if (stage.has_embedding) {
    auto embedding = register_module("embedding", std::make_shared<torch::nn::Module>("LanguageModelEmbedding"));
    embedding_ = embedding;
    word_embeddings_ = embedding->register_module("word_embeddings", std::make_shared<ShardedModule>("VocabParallelEmbedding"));
    word_embeddings_->add_param("weight", f.normal("embedding.word_embeddings.weight", word, embedding_init_std(m)), word);
    if (m.position_embedding == PositionEmbedding::LearnedAbsolute) {
      ParamInfo pos;
      pos.global_shape = {m.max_position_embeddings, m.hidden_size};
      position_embeddings_ = embedding->register_module("position_embeddings", std::make_shared<ShardedModule>("Embedding"));
      position_embeddings_->add_param("weight", f.normal("embedding.position_embeddings.weight", pos, embedding_init_std(m)), pos);
    }
  }
  auto decoder = register_module("decoder", std::make_shared<torch::nn::Module>("TransformerBlock"));
  auto layers = decoder->register_module("layers", std::make_shared<torch::nn::Module>("Layers"));
  for (int64_t i = stage.first_layer; i < stage.first_layer + stage.num_layers; ++i)
    layers_.push_back(
        layers->register_module(std::to_string(i), TransformerLayer(m, "decoder.layers." + std::to_string(i), i, f, moe_)));
  // The decoder's final norm closes the last transformer layer: on the loss stage, or with MTP on
  // the stage holding the last layer (the MTP layers start from the normed hidden states).
  final_norm_here_ = mtp ? stage.num_layers > 0 && stage.first_layer + stage.num_layers == m.num_layers : stage.has_head;
  if (final_norm_here_) {
    // Under SP the final norm runs on sequence shards: partial gradients per rank.
    final_layernorm_ = decoder->register_module("final_layernorm", TELayerNorm(NormOptions::from(m, m.hidden_size), tp.sequence_parallel, f));
  }
  if (stage.has_head) {
    // Megatron: init_method, or under MuP (untied) the embedding's init: unscaled either way.
    LinearOptions out{m.hidden_size, m.padded_vocab_size, false, embedding_init_std(m), 1, "output_layer", tied};
    out.delay_wgrad = false;  // Megatron's output layer is no TE linear: its weight gradient is not held
    out.fp8 = false;  // the logits GEMM stays bf16, as Megatron's output layer
    output_layer_ = register_module("output_layer", TEColumnParallelLinear(out, f));
    if ((tied || mtp) && !stage.has_embedding) {
      // The output layer (tied) or the MTP layers use the word embedding. A last stage without
      // the embedding keeps a copy drawn from the same seed, kept equal by summing the two
      // stages' gradients (Megatron's embedding group).
      ParamInfo copy = word;
      copy.shared_embedding_copy = true;
      output_copy_ = std::make_shared<ShardedModule>("SharedEmbedding");
      register_module("output_layer_shared", output_copy_);
      output_copy_->add_param("weight", f.normal("embedding.word_embeddings.weight", copy, embedding_init_std(m)), copy);
    }
    if (mtp) {
      auto block = register_module("mtp", std::make_shared<torch::nn::Module>("MultiTokenPredictionBlock"));
      auto mtp_list = block->register_module("layers", std::make_shared<torch::nn::Module>("Layers"));
      const bool moe_mtp = mtp_layers_are_moe(m, stage.num_layers > 0);
      for (int64_t k = 0; k < m.mtp.num_layers; ++k)
        mtp_layers_.push_back(mtp_list->register_module(
            std::to_string(k), std::make_shared<MtpLayerImpl>(m, k, f, moe_mtp ? moe_ : nullptr)));
    }
  }
}

void GptModelImpl::defer_output_wgrad(int64_t limit) {
  FP8TRON_CHECK(output_layer_ && output_layer_->plan().path == LinearPath::kPlain && !output_layer_->bias.defined(),
                "the deferred output-layer weight gradient needs the plain bf16 output layer of the last stage");
  output_layer_->wgrad_deferral = std::make_shared<WgradDeferral>(limit, main_grads_);
}

void GptModelImpl::drain_output_wgrad() {
  if (!output_layer_ || !output_layer_->wgrad_deferral) return;
  output_layer_->wgrad_deferral->drain();
}

torch::Tensor GptModelImpl::shared_embedding_weight() const {
  if (config_.untie_embeddings_and_output_weights) return {};
  if (word_embeddings_) return word_embeddings_->named_parameters(false)["weight"];
  if (output_copy_) return output_copy_->named_parameters(false)["weight"];
  return {};
}

torch::Tensor GptModelImpl::word_embedding_weight() const {
  if (word_embeddings_) return word_embeddings_->named_parameters(false)["weight"];
  FP8TRON_CHECK(output_copy_ != nullptr, "this pipeline stage holds no word embedding");
  return output_copy_->named_parameters(false)["weight"];
}

torch::Tensor GptModelImpl::embed(const torch::Tensor& tokens, const torch::Tensor& position_ids) {
  if (embedding_) params_ready(*embedding_);
  if (output_copy_) params_ready(*output_copy_);
  auto t = tokens.t();  // [s, b]
  const int64_t vocab_start = tp_.rank * (config_.padded_vocab_size / tp_.size);
  // One rank holds the whole vocabulary: the lookup whose backward sums into the main gradient.
  auto h = tp_.size == 1 ? embedding_lookup(t, word_embedding_weight(), main_grads_)
                         : vocab_parallel_embedding(t, word_embedding_weight(), vocab_start, *tp_.comm);
  if (position_embeddings_) {
    auto table = position_embeddings_->named_parameters(false)["weight"];
    torch::Tensor rows;  // the positions of the tokens: 0..s-1, or a context-parallel shard's own
    if (!position_ids.defined() && cp_.enabled())
      rows = table.index_select(0, cp_positions(config_.seq_length, cp_.size(), cp_.rank()).to(table.device()));
    else if (!position_ids.defined())
      rows = table.narrow(0, 0, t.size(0));
    h = position_ids.defined() ? h + F::embedding(position_ids.t(), table) : h + rows.unsqueeze(1);
  }
  // MuP: the embedding output (word + position) times --mup-embedding-mult, before SP and dropout.
  if (config_.mup.enabled && config_.mup.embedding_mult != 1.0) h = h * config_.mup.embedding_mult;
  if (tp_.sequence_parallel) h = scatter_to_sp(h, *tp_.comm);
  if (embedding_) params_used(*embedding_, {h});
  if (output_copy_) params_used(*output_copy_, {h});
  return maybe_dropout(h, config_.hidden_dropout, is_training());
}

torch::Tensor GptModelImpl::final_norm(const ResidualStream& in) {
  params_ready(*final_layernorm_);
  auto normed = final_layernorm_->forward_residual(in).normed;
  params_used(*final_layernorm_, {normed});
  return normed;
}

torch::Tensor GptModelImpl::output_logits(const torch::Tensor& h) {
  params_ready(*output_layer_);
  const bool tied = !config_.untie_embeddings_and_output_weights;
  // The tied word embedding (a first stage's was ready already unless sharded weights released it).
  const torch::nn::Module* tied_part = !tied ? nullptr : output_copy_ ? output_copy_.get() : word_embeddings_.get();
  if (tied_part) params_ready(*tied_part);
  auto logits = tied ? output_layer_->forward_with(h, shared_embedding_weight()) : output_layer_(h);  // [s, b, V/tp]
  params_used(*output_layer_, {logits});
  if (tied_part) params_used(*tied_part, {logits});
  // MuP (Megatron's _scale_logits): the main and the MTP heads' logits times the output multiplier.
  if (config_.mup.enabled && config_.mup.output_mult != 1.0) logits = logits * config_.mup.output_mult;
  return logits;
}

torch::Tensor GptModelImpl::token_losses(const torch::Tensor& logits, const torch::Tensor& labels) {
  const int64_t vocab_start = tp_.rank * (config_.padded_vocab_size / tp_.size);
  return fused_vocab_parallel_cross_entropy(logits, labels.t(), vocab_start, *tp_.comm);  // [s, b]
}

// Megatron's process_mtp_loss: depth k predicts the labels rolled k more positions (the last k
// positions masked out). Its term (lambda / D) x sum(mask_k ce_k) / max(n_k, 1) -- with
// --calculate-per-token-loss x n_0 instead of / 1 -- enters the gradient only (MTPLossAutoScaler):
// the value returned is zero.
// Context parallelism: the rolls cross chunk and rank boundaries (Megatron's roll_tensor with the
// context-parallel group), and n_0 and n_k are the micro-batch's counts (summed over the
// context-parallel ranks, as the lm loss's), so the ranks' terms add up to one process's term.
// (Megatron divides by each rank's own counts: the same when the ranks count alike.)
torch::Tensor GptModelImpl::mtp_loss(const torch::Tensor& hidden, const torch::Tensor& tokens, const torch::Tensor& labels,
                                     const torch::Tensor& loss_mask, const torch::Tensor& position_ids,
                                     const torch::Tensor& attention_mask) {
  FP8TRON_CHECK(tokens.defined(), "multi-token prediction needs the tokens on the loss stage");
  const double scale = config_.mtp.loss_scaling_factor / double(config_.mtp.num_layers);
  auto ids = tokens, lab = labels, mask = loss_mask.to(torch::kFloat32), positions = position_ids;
  if (position_embeddings_ && !positions.defined()) {
    // The shard's global positions under context parallelism.
    auto own = cp_.enabled() ? cp_positions(config_.seq_length, cp_.size(), cp_.rank()).to(tokens.device())
                             : torch::arange(tokens.size(1), tokens.options());
    positions = own.to(tokens.scalar_type()).unsqueeze(0).expand({tokens.size(0), tokens.size(1)});
  }
  auto roll = [this](const torch::Tensor& t) { return cp_.enabled() ? cp_roll_left(t, 1, *cp_.group) : roll_left(t); };
  const auto n0 = micro_batch_count(mask.sum());
  auto h = hidden;
  auto total = torch::zeros({}, hidden.options().dtype(torch::kFloat32));
  if (mtp_loss_sums_.empty()) mtp_loss_sums_.assign(mtp_layers_.size(), torch::zeros({}, total.options()));
  for (size_t k = 0; k < mtp_layers_.size(); ++k) {
    ids = roll(ids);
    if (positions.defined()) positions = roll(positions);
    lab = roll(lab);
    mask = roll(mask);
    params_ready(*mtp_layers_[k]);
    h = mtp_layers_[k]->forward(embed(ids, positions), h, attention_mask);
    params_used(*mtp_layers_[k], {h});
    const auto ce = token_losses(output_logits(h), lab);
    const auto m = mask.t();
    const auto sum = (ce * m).sum(), n = micro_batch_count(m.sum());
    mtp_loss_sums_[k] = mtp_loss_sums_[k] + (sum / n.clamp_min(1.0)).detach();
    total = total + scale * (per_token_loss_ ? sum * (n0 / n.clamp_min(1.0)) : sum / n.clamp_min(1.0));
  }
  ++mtp_micro_batches_;
  return total - total.detach();
}

torch::Tensor GptModelImpl::micro_batch_count(const torch::Tensor& local) const {
  if (!cp_.enabled()) return local;
  auto count = local.detach().clone();
  cp_.group->all_reduce(count);
  return count;
}

std::vector<torch::Tensor> GptModelImpl::take_mtp_losses(int64_t* micro_batches) {
  *micro_batches = mtp_micro_batches_;
  mtp_micro_batches_ = 0;
  return std::exchange(mtp_loss_sums_, {});
}

torch::Tensor GptModelImpl::forward_stage(const torch::Tensor& input, const torch::Tensor& labels, const torch::Tensor& loss_mask,
                                          const torch::Tensor& position_ids, const torch::Tensor& segment_ids,
                                          const torch::Tensor& tokens) {
  if (offloader_) offloader_->begin_forward();
  auto h = stage_.has_embedding ? embed(input, position_ids) : input;
  torch::Tensor attention_mask;
  if (segment_ids.defined()) {
    // Attend to earlier positions of the same document only: [b, 1, s, s].
    const int64_t s = segment_ids.size(1);
    auto same = segment_ids.unsqueeze(2) == segment_ids.unsqueeze(1);
    attention_mask = same.logical_and(torch::ones({s, s}, same.options()).tril()).unsqueeze(1);
  }
  const ResidualStream out = run_layers(h, attention_mask);
  h = final_norm_here_ ? final_norm(out) : out.sum(main_grads_);
  if (offloader_) offloader_->offload_deferred();  // the last layer's h: read by the sum above
  if (!stage_.has_head) return h;
  auto per_token = token_losses(output_logits(h), labels);  // [s, b]
  auto mask = loss_mask.t().to(torch::kFloat32);
  // pretrain_gpt.py's loss: the sum over loss tokens; the schedule divides it by their number
  // unless --calculate-per-token-loss (then the gradients are divided by the global count).
  auto loss = (per_token * mask).sum();
  // The mean over the whole sequence: under context parallelism this shard's sum over all shards'
  // tokens. The context-parallel ranks' losses then add up to the micro-batch's (their gradients
  // are summed with the data-parallel reduction, over data x context parallel).
  if (!per_token_loss_) loss = loss / micro_batch_count(mask.sum()).clamp_min(1.0);
  if (!mtp_layers_.empty() && is_training()) {
    loss = loss + mtp_loss(h, stage_.has_embedding ? input : tokens, labels, loss_mask, position_ids, attention_mask);
    if (offloader_) offloader_->offload_deferred();  // the MTP layers' h
  }
  return loss;
}

ResidualStream GptModelImpl::run_layers(const torch::Tensor& h, const torch::Tensor& attention_mask) {
  RecomputeOptions options;
  if (config_.recompute.distribute_saved_activations && tp_.size > 1) options.distribute_over = tp_.comm.get();
  ResidualStream stream{h, {}};
  for (const LayerUnit& unit : layer_units(config_.recompute, int64_t(layers_.size()))) {
    if (!unit.recomputed || !is_training()) {
      for (int64_t i = unit.begin; i < unit.end; ++i) {
        params_ready(*layers_[size_t(i)]);
        stream = layers_[size_t(i)]->forward_stream(stream, attention_mask);
        params_used(*layers_[size_t(i)], {stream.residual, stream.branch, stream.branch_bias});
      }
      continue;
    }
    // Called again in backward: captures by value (the model outlives its graphs). The unit keeps
    // its input only, so its input and output are whole tensors. Each layer's weights are made
    // ready and released around it in both runs (sharded weights: gathered for the forward,
    // again for the recomputation, and again for the backward the recomputation's outputs arm).
    const auto out = recompute(
        [this, unit, attention_mask](const std::vector<torch::Tensor>& in) {
          ResidualStream x{in[0], {}};
          for (int64_t i = unit.begin; i < unit.end; ++i) {
            params_ready(*layers_[size_t(i)]);
            x = layers_[size_t(i)]->forward_stream(x, attention_mask);
            params_used(*layers_[size_t(i)], {x.residual, x.branch, x.branch_bias});
          }
          return x.sum(main_grads_);
        },
        {stream.sum(main_grads_)}, options);
    stream = {out, {}};
  }
  return stream;
}

torch::Tensor GptModelImpl::loss(const torch::Tensor& tokens, const torch::Tensor& labels, const torch::Tensor& loss_mask) {
  FP8TRON_CHECK(stage_.has_embedding && stage_.has_head, "loss() needs the whole model");
  return forward_stage(tokens, labels, loss_mask);
}

torch::Tensor GptModelImpl::forward(const torch::Tensor& tokens) {
  FP8TRON_CHECK(stage_.has_embedding && stage_.has_head && tp_.size == 1 && !cp_.enabled(),
                "forward() needs the whole model on one rank");
  ResidualStream stream{embed(tokens, {}), {}};
  for (auto& layer : layers_) {
    params_ready(*layer);
    stream = layer->forward_stream(stream);
  }
  return output_logits(final_norm(stream)).transpose(0, 1);  // (the MTP heads are training-only)
}

void configure_attention_backends() {
  at::globalContext().setSDPPriorityOrder({int64_t(at::SDPBackend::cudnn_attention), int64_t(at::SDPBackend::flash_attention),
                                           int64_t(at::SDPBackend::efficient_attention), int64_t(at::SDPBackend::math)});
  at::globalContext().setSDPUseCuDNN(true);
}

std::string attention_backend_name(const ModelConfig& m, int64_t micro_batch, torch::Device device, torch::Dtype dtype) {
  auto opts = torch::TensorOptions().device(device).dtype(dtype);
  auto q = torch::empty({m.seq_length, micro_batch, m.num_attention_heads, m.kv_channels}, opts).permute({1, 2, 0, 3});
  switch (at::SDPBackend(at::_fused_sdp_choice(q, q, q, {}, m.attention_dropout, true))) {
    case at::SDPBackend::cudnn_attention: return "cuDNN fused attention";
    case at::SDPBackend::flash_attention: return "flash attention";
    case at::SDPBackend::efficient_attention: return "memory-efficient attention";
    case at::SDPBackend::math: return "math (unfused) attention";
    default: return "unknown attention backend";
  }
}

}  // namespace fp8tron
