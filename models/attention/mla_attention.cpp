#include "models/attention/mla_attention.h"

#include <cmath>

#include "core/error.h"
#include "fp8/fp8_linear.h"
#include "models/attention/context_parallel_attention.h"
#include "models/init_methods.h"
#include "models/linear/wgrad_deferral.h"
#include "models/recompute/activation_offload.h"
#include "models/recompute/output_discarding_recompute.h"
#include "models/recompute/recompute.h"
#include "parallel/tensor_parallel.h"

namespace fp8tron {
namespace F = torch::nn::functional;

TEDuplicatedLinearImpl::TEDuplicatedLinearImpl(const LinearOptions& o, const ModuleFactory& f) : options(o) {
  ParamInfo info;
  info.global_shape = {o.out_features, o.in_features};
  // Under sequence parallelism each rank sees only its sequence shard: partial gradients.
  info.reduce_grad_over_tp = f.tp().sequence_parallel && f.tp().size > 1;
  weight = add_param("weight", f.normal(o.init_name + ".weight", info, o.init_std), info);
  if (f.fp8() && o.fp8) fp8_site = f.fp8()->add_site(o.init_name, layer_number(o.init_name), o.out_features, o.in_features);
  if (fp8_site) fp8_site->parameter = weight;
  hold_wgrad(o.delay_wgrad, f, weight, fp8_site.get());
  main_grads_ = f.main_grads();
}

torch::Tensor TEDuplicatedLinearImpl::forward(const torch::Tensor& x) {
  if (fp8_site) return fp8::fp8_linear(x, weight, {}, *fp8_site);
  if (auto queue = main_grads_->wgrad_queue_for(weight)) return linear_with_held_wgrad(x, weight, {}, queue, main_grads_);
  return F::linear(x, weight);
}

RotarySpec mla_rotary(const ModelConfig& m) {
  const MlaConfig& a = m.mla;
  RotarySpec spec;
  spec.base = m.rotary_base;
  spec.layout = RotaryLayout::MlaDeinterleave;
  if (a.yarn) {
    // MLA's YaRN: --rotary-scaling-factor, --mscale, --mscale-all-dim; the other YaRN settings
    // keep their defaults (Megatron's --yarn-* flags feed only the GPT path).
    spec.dim = a.qk_pos_emb_head_dim;
    spec.scaling = RotaryScaling::Yarn;
    spec.yarn.scaling_factor = m.rotary.yarn.scaling_factor;
    spec.yarn.mscale = m.rotary.yarn.mscale;
    spec.yarn.mscale_all_dim = m.rotary.yarn.mscale_all_dim;
  } else {
    spec.dim = int64_t(double(a.qk_pos_emb_head_dim) * m.rotary_percent);
  }
  return spec;
}

double mla_softmax_scale(const ModelConfig& m) {
  // Applied with either rope type, as MultiLatentAttention.__init__ does.
  const double mscale = yarn_mscale(m.rotary.yarn.scaling_factor, m.rotary.yarn.mscale_all_dim);
  return mscale * mscale / std::sqrt(double(m.mla.qk_head_dim + m.mla.qk_pos_emb_head_dim));
}

namespace {
std::shared_ptr<torch::nn::Module> up_projection(const ModelConfig& m, int64_t in, int64_t out, const std::string& name,
                                                 const ModuleFactory& f) {
  LinearOptions o{in, out, /*bias=*/false, hidden_init_std(m), 1, name};
  if (m.qk_layernorm) return std::make_shared<TELayerNormColumnParallelLinearImpl>(NormOptions::from(m, in), o, f);
  return std::make_shared<TEColumnParallelLinearImpl>(o, f);
}
}  // namespace

MlaSelfAttentionImpl::MlaSelfAttentionImpl(const ModelConfig& m, const std::string& prefix, const ModuleFactory& f)
    : config_(m),
      tp_(f.tp()),
      cp_(f.cp()),
      cp_comm_type_(f.cp().config.comm_type(per_layer_index(prefix))),
      local_heads_(m.num_attention_heads / f.tp().size),
      // Under context parallelism the tokens are this rank's shard: their own positions.
      rope_(mla_rotary(m), f.cp().enabled() ? cp_positions(m.seq_length, f.cp().size(), f.cp().rank()) : torch::Tensor()),
      softmax_scale_(mla_softmax_scale(m)),
      recompute_up_proj_(m.recompute.selective(&RecomputeModules::mla_up_proj)),
      recompute_core_(m.recompute.selective(&RecomputeModules::core_attn)),
      offload_core_(m.offload.on(&OffloadModules::core_attn) ? f.offloader().get() : nullptr),
      offload_proj_(m.offload.on(&OffloadModules::attn_proj) ? f.offloader().get() : nullptr) {
  const MlaConfig& a = m.mla;
  const int64_t n = m.num_attention_heads, H = m.hidden_size;
  const int64_t q_head = a.qk_head_dim + a.qk_pos_emb_head_dim;
  if (a.q_lora_rank) {
    linear_q_down_proj = register_module(
        "linear_q_down_proj",
        TEDuplicatedLinear(LinearOptions{H, *a.q_lora_rank, false, hidden_init_std(m), 1, prefix + ".linear_q_down_proj"}, f));
    linear_q_up_proj = register_module("linear_q_up_proj",
                                       up_projection(m, *a.q_lora_rank, n * q_head, prefix + ".linear_q_up_proj", f));
  } else {
    // Megatron's linear_q_proj is a plain column-parallel linear: the layer's input norm precedes
    // it, and --qk-layernorm normalises the latents only.
    linear_q_proj = register_module(
        "linear_q_proj",
        std::make_shared<TEColumnParallelLinearImpl>(
            LinearOptions{H, n * q_head, /*bias=*/false, hidden_init_std(m), 1, prefix + ".linear_q_proj"}, f));
  }
  linear_kv_down_proj = register_module(
      "linear_kv_down_proj", TEDuplicatedLinear(LinearOptions{H, a.kv_lora_rank + a.qk_pos_emb_head_dim, false,
                                                              hidden_init_std(m), 1, prefix + ".linear_kv_down_proj"},
                                                f));
  linear_kv_up_proj = register_module(
      "linear_kv_up_proj", up_projection(m, a.kv_lora_rank, n * (a.qk_head_dim + a.v_head_dim), prefix + ".linear_kv_up_proj", f));
  const double output_std = output_layer_init_std(m);
  linear_proj = register_module(
      "linear_proj", TERowParallelLinear(LinearOptions{n * a.v_head_dim, H, m.add_bias_linear, output_std, 1, prefix + ".linear_proj"}, f));
}

torch::Tensor MlaSelfAttentionImpl::project(const std::shared_ptr<torch::nn::Module>& linear, const torch::Tensor& x) {
  if (auto* fused = dynamic_cast<TELayerNormColumnParallelLinearImpl*>(linear.get())) return fused->forward(x);
  return static_cast<TEColumnParallelLinearImpl*>(linear.get())->forward(x);
}

std::vector<torch::Tensor> MlaSelfAttentionImpl::up_project(const std::vector<torch::Tensor>& compressed) {
  const MlaConfig& a = config_.mla;
  const int64_t dn = a.qk_head_dim, dr = a.qk_pos_emb_head_dim, dv = a.v_head_dim, nl = local_heads_;
  const auto &q_in = compressed[0], &c_kv = compressed[1], &k_pe_in = compressed[2];
  // Queries: through the low-rank bottleneck or straight from the input; heads split over TP.
  auto q = project(a.q_lora_rank ? linear_q_up_proj : linear_q_proj, q_in);
  const int64_t s = q.size(0), b = q.size(1);
  q = q.view({s, b, nl, dn + dr});
  auto q_nope = q.narrow(-1, 0, dn), q_pe = rope_.apply(q.narrow(-1, dn, dr));
  auto kv = project(linear_kv_up_proj, c_kv).view({s, b, nl, dn + dv});
  auto k_pe = rope_.apply(k_pe_in.unsqueeze(2)).expand({s, b, nl, dr});
  return {torch::cat({q_nope, q_pe}, -1), torch::cat({kv.narrow(-1, 0, dn), k_pe}, -1), kv.narrow(-1, dn, dv)};
}

torch::Tensor MlaSelfAttentionImpl::core_attention(const torch::Tensor& query, const torch::Tensor& key,
                                                   const torch::Tensor& v, const torch::Tensor& attention_mask) {
  const int64_t s = query.size(0), b = query.size(1), nl = query.size(2), dqk = query.size(3), dv = v.size(3);
  // Fused GPU kernels want one head size for q, k and v: pad v with zeros and drop the padding
  // after (the math is unchanged). The CPU paths take dv as it is.
  const bool pad_v = v.is_cuda() && dv != dqk;
  const auto value = pad_v ? F::pad(v, F::PadFuncOptions({0, dqk - dv})) : v;
  const double p = is_training() ? config_.attention_dropout : 0.0;
  auto out = attention_kernel(query, key, value, attention_mask, p);  // [s, b, heads, dv (padded)]
  if (pad_v) out = out.narrow(-1, 0, dv);
  return out.reshape({s, b, nl * dv});
}

torch::Tensor MlaSelfAttentionImpl::attention_kernel(const torch::Tensor& query, const torch::Tensor& key,
                                                     const torch::Tensor& value, const torch::Tensor& attention_mask,
                                                     double dropout) const {
  if (cp_.enabled()) {
    FP8TRON_CHECK(!attention_mask.defined(), "context-parallel attention is causal only (--reset-attention-mask is refused)");
    return context_parallel_attention(query, key, value, cp_, cp_comm_type_, dropout, softmax_scale_);
  }
  auto q = query.permute({1, 2, 0, 3}), k = key.permute({1, 2, 0, 3}), v = value.permute({1, 2, 0, 3});  // [b, h, s, d]
  auto out = attention_mask.defined() ? at::scaled_dot_product_attention(q, k, v, attention_mask, dropout, false, softmax_scale_)
                                      : at::scaled_dot_product_attention(q, k, v, {}, dropout, true, softmax_scale_);
  return out.permute({2, 0, 1, 3});
}

torch::Tensor MlaSelfAttentionImpl::attend(const std::vector<torch::Tensor>& qkv, const torch::Tensor& attention_mask) {
  // --offload-modules core_attn: q, k and v (all a recomputed core attention keeps) wait on the host.
  return offloaded_call(offload_core_, "core_attn", qkv, [&] {
    if (!recompute_core_ || !is_training()) return core_attention(qkv[0], qkv[1], qkv[2], attention_mask);
    // Only q, k and v are kept. Called again in backward: captures `this` and the mask.
    return recompute([this, attention_mask](
                         const std::vector<torch::Tensor>& in) { return core_attention(in[0], in[1], in[2], attention_mask); },
                     qkv);
  });
}

torch::Tensor MlaSelfAttentionImpl::forward(const torch::Tensor& x, const torch::Tensor& attention_mask) {
  const MlaConfig& a = config_.mla;
  auto q_in = a.q_lora_rank ? linear_q_down_proj(x) : x;
  // Keys and values: the compressed latent, and the rotary key part shared by every head.
  auto c = linear_kv_down_proj(x);
  auto c_kv = c.narrow(-1, 0, a.kv_lora_rank), k_pe = c.narrow(-1, a.kv_lora_rank, a.qk_pos_emb_head_dim);
  if (tp_.size > 1) k_pe = tp_.sequence_parallel ? gather_from_sp(k_pe, *tp_.comm) : copy_to_tp(k_pe, *tp_.comm);
  if (!recompute_up_proj_ || !is_training()) {
    const auto out = attend(up_project({q_in, c_kv, k_pe}), attention_mask);
    return offloaded_call(offload_proj_, "attn_proj", {out}, [&] { return linear_proj(out); });
  }
  // --recompute-modules mla_up_proj: q, k and v are dropped once attention has run and projected
  // again in backward. Called again in backward: captures `this` (the model outlives its graphs).
  OutputDiscardingRecompute checkpoint;
  const auto qkv = checkpoint.run([this](const std::vector<torch::Tensor>& in) { return up_project(in); }, {q_in, c_kv, k_pe});
  auto out = attend(qkv, attention_mask);
  checkpoint.discard(out);
  return offloaded_call(offload_proj_, "attn_proj", {out}, [&] { return linear_proj(out); });
}

}  // namespace fp8tron
