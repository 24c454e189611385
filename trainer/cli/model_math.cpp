#include "trainer/cli/model_math.h"

#include <algorithm>

namespace fp8tron {
namespace {

// Multi-latent attention's parameters in one layer (with its input norm).
int64_t mla_attention_parameters(const ModelConfig& m, int64_t norm_per_channel) {
  const MlaConfig& a = m.mla;
  const int64_t h = m.hidden_size, n = m.num_attention_heads, q_head = a.qk_head_dim + a.qk_pos_emb_head_dim;
  int64_t p = norm_per_channel * h;  // input_layernorm
  if (a.q_lora_rank) p += h * *a.q_lora_rank + *a.q_lora_rank * n * q_head + (m.qk_layernorm ? norm_per_channel * *a.q_lora_rank : 0);
  else p += h * n * q_head + (m.qk_layernorm ? norm_per_channel * h : 0);
  p += h * (a.kv_lora_rank + a.qk_pos_emb_head_dim);
  p += a.kv_lora_rank * n * (a.qk_head_dim + a.v_head_dim) + (m.qk_layernorm ? norm_per_channel * a.kv_lora_rank : 0);
  p += n * a.v_head_dim * h + (m.add_bias_linear ? h : 0);
  return p;
}

// Megatron's num_floating_point_operations, MLA branch, per token of one layer: the projections
// and (x s) the causal core attention, 3 (fwd + 2 bwd) x 2 (multiply-add).
double mla_attention_flops(const ModelConfig& m) {
  const MlaConfig& a = m.mla;
  const double h = double(m.hidden_size), n = double(m.num_attention_heads), s = double(m.seq_length);
  const double q_head = double(a.qk_head_dim + a.qk_pos_emb_head_dim);
  const double q_term = a.q_lora_rank ? double(*a.q_lora_rank) * (h + n * q_head + 1) : h * n * q_head;
  const double kv_term = double(a.kv_lora_rank) * (h + n * double(a.qk_head_dim + a.v_head_dim) + 1) + h * double(a.qk_pos_emb_head_dim);
  const double o_term = n * double(a.v_head_dim) * h;
  const double core = n * q_head / 2 + n * double(a.v_head_dim) / 2;
  return 6.0 * (q_term + kv_term + o_term + s * core);
}

}  // namespace

ParameterCount count_parameters(const ModelConfig& m) {
  ParameterCount p;
  const int64_t h = m.hidden_size, f = m.ffn_hidden_size;
  const int64_t q = m.num_attention_heads * m.kv_channels, kv = m.num_query_groups * m.kv_channels;
  const bool ln = m.normalization == Normalization::LayerNorm;
  const int64_t norm = ln ? 2 * h : h;  // weight (+ bias for LayerNorm)
  p.embedding = m.padded_vocab_size * h +
                (m.position_embedding == PositionEmbedding::LearnedAbsolute ? m.max_position_embeddings * h : 0);
  int64_t layer = 0;
  if (m.mla.enabled) {
    layer += mla_attention_parameters(m, ln ? 2 : 1);
  } else {
    layer += norm;                                                  // input norm
    const int64_t qkv = q + 2 * kv + (m.attention_output_gate ? q : 0);  // queries (and their gates), keys, values
    layer += h * qkv + (m.add_qkv_bias ? qkv : 0);
    if (m.qk_layernorm) layer += 2 * (ln ? 2 * m.kv_channels : m.kv_channels);
    layer += q * h + (m.add_bias_linear ? h : 0);  // attention output projection
  }
  layer += norm;                                 // pre-MLP norm
  const int64_t fc1_out = m.swiglu ? 2 * f : f;
  layer += h * fc1_out + (m.add_bias_linear ? fc1_out : 0);
  layer += f * h + (m.add_bias_linear ? h : 0);
  p.per_layer = layer;
  p.final_norm = norm;
  p.output_layer = m.untie_embeddings_and_output_weights ? m.padded_vocab_size * h : 0;
  // Multi-token prediction: per depth enorm, hnorm, eh_proj [H, 2H], a layer and its final norm
  // (the layer an MoE layer below when mtp_layers_are_moe).
  p.mtp = m.mtp.num_layers * (3 * norm + 2 * h * h + p.per_layer);
  p.total = p.embedding + m.num_layers * p.per_layer + p.final_norm + p.output_layer + p.mtp;
  p.active = p.total;
  if (!m.moe.enabled()) return p;
  // An MoE layer: the dense layer's attention and norms, a router and experts instead of the MLP.
  const MoeConfig& e = m.moe;
  const int64_t dense_mlp = h * fc1_out + (m.add_bias_linear ? fc1_out : 0) + f * h + (m.add_bias_linear ? h : 0);
  const int64_t ef = e.ffn_hidden_size, expert_fc1 = m.swiglu ? 2 * ef : ef;
  const int64_t expert = h * expert_fc1 + (m.add_bias_linear ? expert_fc1 : 0) + ef * h + (m.add_bias_linear ? h : 0);
  const int64_t shared_fc1 = m.swiglu ? 2 * e.shared_expert_size : e.shared_expert_size;
  const int64_t shared = h * shared_fc1 + e.shared_expert_size * h + (e.shared_expert_gate ? h : 0);
  const int64_t router = e.num_experts * h + (m.add_bias_linear ? e.num_experts : 0);
  p.moe_layers = e.num_moe_layers();
  p.experts_per_moe_layer = e.num_experts * expert;
  p.per_moe_layer = p.per_layer - dense_mlp + router + p.experts_per_moe_layer + shared;
  const bool mtp_moe = mtp_layers_are_moe(m, !m.mtp.chunk_without_decoder_layers);
  if (mtp_moe) p.mtp += m.mtp.num_layers * (p.per_moe_layer - p.per_layer);
  p.total = p.embedding + (m.num_layers - p.moe_layers) * p.per_layer + p.moe_layers * p.per_moe_layer + p.final_norm +
            p.output_layer + p.mtp;
  const int64_t routed_layers = p.moe_layers + (mtp_moe ? m.mtp.num_layers : 0);
  p.active = p.total - routed_layers * (e.num_experts - e.topk) * expert;
  return p;
}

namespace {
// Megatron's transformer_flops for an MoE model (training.py), per token. The MTP layers count as
// layers (MoE layers when the last decoder layer is one: the pattern decides, as there), plus
// their norms and eh_proj and one more logits GEMM per depth.
double moe_training_flops_per_token(const ModelConfig& m) {
  const MoeConfig& e = m.moe;
  const double D = double(m.mtp.num_layers);
  const double h = double(m.hidden_size), layers = double(m.num_layers) + D, s = double(m.seq_length);
  const double f = m.swiglu ? 3.0 : 2.0;  // the stacked fc1 (gate|up) and fc2 GEMMs
  const double last_layer_moe = e.is_moe_layer(m.num_layers - 1) ? 1.0 : 0.0;
  const double moe_layers = double(e.num_moe_layers()) + last_layer_moe * D, dense_layers = layers - moe_layers;
  const double q = double(m.kv_channels * m.num_attention_heads), kv = double(m.kv_channels * m.num_query_groups);
  const double mlp = 6.0 * h *
                     (double(m.ffn_hidden_size) * f * dense_layers + double(e.ffn_hidden_size) * double(e.topk) * f * moe_layers +
                      double(e.shared_expert_size) * f * moe_layers);
  const double gates = m.attention_output_gate ? q : 0.0;  // the output gate's columns of the QKV GEMM (Megatron counts them)
  const double projections = 6.0 * layers * (h * (q + gates + 2.0 * kv) + q * h);
  const double mtp = 6.0 * D * (3.0 * h + 2.0 * h * h);
  const double logits = 6.0 * h * double(m.padded_vocab_size) * (1.0 + D);
  const double core_attention = 6.0 * q * s * layers;  // QK^T and AV, halved for the causal mask
  // Multi-latent attention: its own projections and core attention (as in the dense formula).
  if (m.mla.enabled) return mlp + layers * mla_attention_flops(m) + mtp + logits;
  return mlp + projections + mtp + logits + core_attention;
}
}  // namespace

double training_flops_per_token(const ModelConfig& m) {
  if (m.moe.enabled()) return moe_training_flops_per_token(m);
  // 12 = 3 (fwd + 2x bwd) x 2 (multiply-add) x 2 (the GEMM pairs of the formula).
  const double h = double(m.hidden_size), L = double(m.num_layers), s = double(m.seq_length);
  const double heads = double(m.num_attention_heads), groups = double(m.num_query_groups);
  const double q_ratio = double(m.kv_channels) * heads / h;
  const double gated = m.swiglu ? 1.5 : 1.0;
  // The output gate's QKV columns: 6 h q more, half a unit of 12 h q.
  const double gate = m.attention_output_gate ? 0.5 : 0.0;
  const double attention = (1.0 + groups / heads + gate + s / h) * q_ratio;
  const double mlp = double(m.ffn_hidden_size) / h * gated;
  const double logits = double(m.padded_vocab_size) / (2.0 * L * h);
  const double D = double(m.mtp.num_layers);
  if (!m.mla.enabled && D == 0) return 12.0 * L * h * h * (attention + mlp + logits);
  // Megatron counts the MTP layers as layers, their eh_proj, and one more logits GEMM per depth.
  const double per_layer = (m.mla.enabled ? mla_attention_flops(m) : 12.0 * h * h * attention) + 12.0 * h * h * mlp;
  return (L + D) * per_layer + (1 + D) * 6.0 * h * double(m.padded_vocab_size) + D * 6.0 * 2 * h * h;
}

MemoryEstimate estimate_memory(const Config& c) {
  const ModelConfig& m = c.model;
  const ParallelSizes& par = c.parallel;
  MemoryEstimate e;
  const ParameterCount p = count_parameters(m);
  // First pipeline stage: its layers plus the embedding (and the output layer when pp == 1).
  const double layers_here = double(m.num_layers) / par.pp;
  // MoE layers: their experts spread over the expert-parallel and expert tensor-parallel ranks.
  const double moe_fraction = m.moe.enabled() ? double(p.moe_layers) / double(m.num_layers) : 0.0;
  const double dense_layer_params =
      (1.0 - moe_fraction) * double(p.per_layer) + moe_fraction * double(p.per_moe_layer - p.experts_per_moe_layer);
  double dense_params = layers_here * dense_layer_params / par.tp + double(p.embedding) / par.tp;
  if (par.pp == 1) dense_params += double(p.final_norm + p.output_layer) / par.tp;
  const double expert_params =
      m.moe.enabled() ? layers_here * moe_fraction * double(p.experts_per_moe_layer) / double(par.ep * par.etp) : 0.0;
  const double params = dense_params + expert_params;
  const bool low_precision = c.precision.params_dtype != ParamDtype::Fp32;
  const DistributedConfig& d = c.distributed;
  // The distributed optimizer keeps the fp32 main weights and the optimizer states of its shard
  // only: 1/(dp x cp / N) of the dense ones and 1/(edp / N) of the experts', N optimizer instances.
  const double dense_shards = d.distributed_optimizer ? double(par.dp) * par.cp / d.optimizer_instances : 1.0;
  const double expert_shards = d.distributed_optimizer ? double(par.edp) / d.optimizer_instances : 1.0;
  const double optimizer_params = dense_params / std::max(1.0, dense_shards) + expert_params / std::max(1.0, expert_shards);
  const bool separate_main = low_precision || dense_shards > 1.0;
  e.weights = params * (low_precision ? 2 : 4);
  if (d.shard_params() && dense_shards > 1.0) {
    // Megatron-FSDP optim_grads_params: the weights between uses are the optimizer's shard; the
    // largest unit (a layer, the embedding or the output layer) is gathered around its use, and
    // with --overlap-param-gather the next one is in flight too.
    const double layer = std::max(dense_layer_params / par.tp,
                                  m.moe.enabled() ? double(p.per_moe_layer - p.experts_per_moe_layer) / par.tp +
                                                        double(p.experts_per_moe_layer) / double(par.ep * par.etp)
                                                  : 0.0);
    const double unit = std::max({layer, double(p.embedding) / par.tp, double(p.output_layer) / par.tp});
    e.weights = optimizer_params * (low_precision ? 2 : 4);
    e.gathered_weights = unit * (d.overlap_param_gather ? 2 : 1) * (low_precision ? 2 : 4);
  }
  if (d.dp_sharding == DataParallelSharding::OptimGrads && dense_shards > 1.0)
    // optim_grads: the whole weights, gathered unit by unit from the optimizer's shard of them.
    e.weights = (params + optimizer_params) * (low_precision ? 2 : 4);
  // fp32, or fp16 scaled per parameter with the precision-aware optimizer's --main-params-dtype fp16.
  const PrecisionAwareOptimizer& aware = c.optimizer.precision_aware;
  const double main_bytes = aware.enabled && aware.main_params == StateDtype::Fp16 ? 2 : 4;
  e.main_weights = separate_main ? optimizer_params * main_bytes : 0;
  const double grad_bytes = c.precision.grads_in_fp32 ? 4 : 2;
  e.grads = params * grad_bytes;
  // optim_grads and optim_grads_params shard the gradients (parallel/sharded_grads.h): a unit's gradients
  // exist from its backward pass until their reduction lands, with at most one reduction in flight
  // while the next unit accumulates and the one after starts, so about three units at once. Kept
  // whole for the step: the tied embedding's on a pipeline's first stage, and with
  // --delay-wgrad-compute the layers' (their held gradients come after autograd has passed them).
  const bool sharded_grads = d.shard_grads() && dense_shards > 1.0;
  e.sharded_grads = sharded_grads;
  if (sharded_grads) {
    const double layer = std::max(dense_layer_params / par.tp,
                                  m.moe.enabled() ? double(p.per_moe_layer - p.experts_per_moe_layer) / par.tp +
                                                        double(p.experts_per_moe_layer) / double(par.ep * par.etp)
                                                  : 0.0);
    const double unit = std::max({layer, double(p.embedding) / par.tp, double(p.output_layer) / par.tp});
    const double kept_embedding = par.pp > 1 && !m.untie_embeddings_and_output_weights ? double(p.embedding) / par.tp : 0.0;
    e.grads = m.moe.delay_wgrad_compute ? params * grad_bytes : (3 * unit + kept_embedding) * grad_bytes;
  }
  // Weights are drawn in fp32 and moved to the device before the optimizer casts them into its
  // buffers: the whole fp32 model then sits beside the weight buffer (whole even where ZeRO-3
  // shards it afterwards) and the main weights (fp16 ones are stored from an fp32 copy of the
  // shard); the gradient buffer and the states come after.
  const double fp32_main_copy = separate_main && main_bytes < 4 ? optimizer_params * 4 : 0;
  e.startup = params * 4 + params * (low_precision ? 2 : 4) + e.main_weights + fp32_main_copy;
  // 16-bit gradients are reduced into an fp32 copy of the optimizer's shard (fp32 ones in place);
  // sharded gradients are summed into one.
  if (!c.precision.grads_in_fp32 || sharded_grads) e.grad_shard = optimizer_params * 4;
  // Adam's two moments (4 bytes each; with the precision-aware optimizer 2 in bf16 or fp16, 1 in
  // fp8); SGD's momentum. (Scaled moments add a 4-byte scale per parameter, and the update's fp32
  // copies of one parameter's moments at a time.)
  const PrecisionAwareOptimizer& pa = c.optimizer.precision_aware;
  auto state_bytes = [&](StateDtype d) {
    if (!pa.enabled) return 4.0;
    return d == StateDtype::Bf16 || d == StateDtype::Fp16 ? 2.0 : d == StateDtype::Fp8 ? 1.0 : 4.0;
  };
  e.optimizer_states = c.optimizer.optimizer == "adam" ? optimizer_params * (state_bytes(pa.exp_avg) + state_bytes(pa.exp_avg_sq))
                                                       : optimizer_params * 4;

  // Activations per layer in bytes (16-bit activations): s*b*h*(34 + 5*a*s/h) without parallelism;
  // tensor parallel without SP: s*b*h*(10 + 24/t + 5*a*s/(h*t)). The 5as/h term is the stored
  // attention scores, softmax and its dropout mask, which fused attention does not keep; it keeps
  // per-row softmax statistics instead (4 bytes x a x s).
  // Context parallelism: each rank holds s / cp of the tokens (its queries still see all s keys).
  const double s_all = double(m.seq_length), s = s_all / par.cp, b = double(c.training.micro_batch_size);
  const double h = double(m.hidden_size), a = double(m.num_attention_heads), t = double(par.tp);
  const double linear_part = s * b * h * (10.0 + 24.0 / t);
  const double scores = s * b * h * 5.0 * a * s_all / (h * t);
  const double softmax_stats = 4.0 * a / t * s * b;
  // 1F1B keeps up to pp micro-batches in flight on the first stage: L/pp layers x pp = L layers.
  const double stored_layers = par.pp > 1 ? double(m.num_layers) : layers_here;
  const RecomputeConfig& r = m.recompute;
  // Selective recomputation of core_attn keeps no scores (the paper's 34 s b h per layer).
  const double kept_scores = r.selective(&RecomputeModules::core_attn) ? 0.0 : scores;
  e.activations_paper = stored_layers * (linear_part + kept_scores);
  e.activations_fused = stored_layers * (linear_part + softmax_stats);
  if (r.full() && r.num_layers > 0) {
    // Recomputed layers keep their unit's 16-bit input (split over TP with SP or
    // --distribute-saved-activations); one unit at a time is replayed with everything.
    const double chunk_layers = layers_here / std::max<int64_t>(1, c.distributed.virtual_stages);
    const double split = c.distributed.sequence_parallel || r.distribute_saved_activations ? t : 1.0;
    const double input = 2.0 * s * b * h / split;
    const double recomputed_fraction =
        r.method == RecomputeMethod::Uniform ? 1.0 : std::min(1.0, double(r.num_layers) / chunk_layers);
    const double unit = r.method == RecomputeMethod::Uniform ? std::min(chunk_layers, double(r.num_layers)) : 1.0;
    auto with_recompute = [&](double per_layer) {
      const double kept = stored_layers * (1.0 - recomputed_fraction) * per_layer;
      return kept + stored_layers * recomputed_fraction * input / unit + unit * per_layer;
    };
    e.activations_paper = with_recompute(linear_part + kept_scores);
    e.activations_fused = with_recompute(linear_part + softmax_stats);
  }
  if (par.pp == 1) e.logits = s * b * double(m.padded_vocab_size) / t * (2.0 + 4.0);  // bf16 logits + fp32 loss input
  return e;
}

}  // namespace fp8tron
