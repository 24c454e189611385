// Megatron's core attention (TEDotProductAttention): softmax(Q K^T / sqrt(d)) V (--use-mup: its
// softmax scale instead, ModelConfig::mup), causal (or under
// a document mask), with dropout on the probabilities, grouped keys and values, and context
// parallelism (models/attention/context_parallel_attention.h, by the layer's --cp-comm-type). With
// --recompute-granularity selective and core_attn in --recompute-modules it is recomputed in
// backward (models/recompute/recompute.h): only q, k and v are kept. With
// --fp8-dot-product-attention it runs in FP8 (models/attention/fp8_attention.h).
#pragma once
#include <torch/torch.h>

#include <memory>

#include "core/config/model_config.h"
#include "models/attention/fp8_attention.h"
#include "parallel/context_parallel.h"

namespace fp8tron {

class CoreAttention {
 public:
  CoreAttention() = default;
  // `layer`: the global layer number (its --cp-comm-type); `fp8`: the model's FP8 engine (null:
  // bf16), where the attention registers as `name` when FP8 attention is on.
  CoreAttention(const ModelConfig& m, int64_t layer, ContextParallelContext cp,
                const std::shared_ptr<fp8::Fp8Engine>& fp8 = nullptr, const std::string& name = "");

  // q [s, b, heads, d], k and v [s, b, groups, d] (this rank's heads; under context parallelism
  // its sequence shard). attention_mask: [b, 1, s, s] bool (true = may attend) or undefined for
  // causal. Returns [s, b, heads * d].
  torch::Tensor forward(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                        const torch::Tensor& attention_mask, double dropout, bool training) const;

  // Whether backward holds forward()'s output anyway: the fused kernels (cuDNN, flash) keep their
  // output and lay it out as q is, so [s, b, heads * d] is a view of it. The output projection
  // then casts its FP8 input again from it in backward instead of keeping a copy
  // (--fp8-transposes recast). Not when recomputed, in FP8 (it keeps FP8 codes) or under context
  // parallelism (its output is assembled from the chunks').
  bool keeps_output() const { return !recompute_ && !fp8_ && !cp_.enabled(); }

 private:
  torch::Tensor attend(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                       const torch::Tensor& attention_mask, double dropout) const;

  bool recompute_ = false;
  ContextParallelContext cp_;
  CpCommType comm_type_ = CpCommType::P2P;
  double scale_ = 1;
  // The scale handed to SDPA: none for its own 1 / sqrt(d) (the same value), MuP's otherwise.
  std::optional<double> sdpa_scale_;
  std::shared_ptr<Fp8Attention> fp8_;  // --fp8-dot-product-attention
};

}  // namespace fp8tron
