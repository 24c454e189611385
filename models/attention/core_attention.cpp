#include "models/attention/core_attention.h"

#include <cmath>

#include "core/error.h"
#include "models/attention/context_parallel_attention.h"
#include "models/recompute/recompute.h"

namespace fp8tron {

CoreAttention::CoreAttention(const ModelConfig& m, int64_t layer, ContextParallelContext cp,
                             const std::shared_ptr<fp8::Fp8Engine>& fp8, const std::string& name)
    : recompute_(m.recompute.selective(&RecomputeModules::core_attn)),
      cp_(std::move(cp)),
      comm_type_(cp_.config.comm_type(layer)),
      scale_(m.mup.softmax_scale.value_or(1.0 / std::sqrt(double(m.kv_channels)))),
      sdpa_scale_(m.mup.softmax_scale) {
  if (!fp8) return;
  if (auto site = fp8->add_attention_site(name, layer)) fp8_ = std::make_shared<Fp8Attention>(fp8, std::move(site), scale_, m.kv_channels);
}

torch::Tensor CoreAttention::forward(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                     const torch::Tensor& attention_mask, double dropout, bool training) const {
  if (!recompute_ || !training) return attend(q, k, v, attention_mask, dropout);
  // Called again in backward: captures by value (the module outlives its graphs).
  return recompute([this, attention_mask, dropout](const std::vector<torch::Tensor>& in) {
                     return attend(in[0], in[1], in[2], attention_mask, dropout);
                   },
                   {q, k, v});
}

torch::Tensor CoreAttention::attend(const torch::Tensor& q_in, const torch::Tensor& k_in, const torch::Tensor& v_in,
                                    const torch::Tensor& attention_mask, double dropout) const {
  const int64_t s = q_in.size(0), b = q_in.size(1), heads = q_in.size(2), d = q_in.size(3);
  if (fp8_) {
    // The flag's rules (trainer/cli/validation.cpp) leave only plain causal attention here.
    FP8TRON_CHECK(!attention_mask.defined() && dropout == 0 && !cp_.enabled(),
                  "FP8 attention takes causal attention without a mask, dropout or context parallelism");
    return fp8_->forward(q_in, k_in, v_in);
  }
  if (cp_.enabled())
    return context_parallel_attention(q_in, k_in, v_in, cp_, comm_type_, dropout, scale_).reshape({s, b, heads * d});
  // SDPA takes [b, heads, s, d]. Grouped keys/values: plain causal attention on the GPU hands the
  // groups to cuDNN's kernels as they are (enable_gqa; measured on an H100 at LLaMA-1.1B shapes:
  // 0.87 vs 0.95 ms per layer with the repeat); elsewhere they are repeated per query head so every
  // backend accepts them.
  auto q = q_in.permute({1, 2, 0, 3}), k = k_in.permute({1, 2, 0, 3}), v = v_in.permute({1, 2, 0, 3});
  const int64_t per_group = heads / k.size(1);
  const bool native_groups = per_group > 1 && q.is_cuda() && !attention_mask.defined();
  if (per_group > 1 && !native_groups) {
    k = k.repeat_interleave(per_group, 1);
    v = v.repeat_interleave(per_group, 1);
  }
  // A document mask (--reset-attention-mask) already contains causality; it takes SDPA's
  // unfused-mask path, so plain causal attention keeps the fused kernels.
  auto out = attention_mask.defined()
                 ? at::scaled_dot_product_attention(q, k, v, attention_mask, dropout, /*is_causal=*/false, sdpa_scale_)
                 : at::scaled_dot_product_attention(q, k, v, {}, dropout, /*is_causal=*/true, sdpa_scale_, native_groups);
  return out.permute({2, 0, 1, 3}).reshape({s, b, heads * d});
}

}  // namespace fp8tron
