#include "models/moe/fused_topk_routing.h"

#include <ATen/cuda/CUDAContext.h>

#include "core/error.h"
#include "models/moe/router_kernels.h"

namespace fp8tron::moe {
namespace {
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// S * (g - sum_e S g): the backward of a softmax S over the last dimension.
torch::Tensor softmax_backward(const torch::Tensor& s, const torch::Tensor& g) {
  return s * (g - (s * g).sum(-1, true));
}

struct FusedTopkSoftmax : torch::autograd::Function<FusedTopkSoftmax> {
  static variable_list forward(AutogradContext* ctx, const torch::Tensor& logits_in, int64_t topk, bool pre_softmax,
                               double scaling_factor) {
    auto logits = logits_in.contiguous();
    const int64_t tokens = logits.size(0), experts = logits.size(1);
    const auto on = logits.options();
    auto probs = torch::empty({tokens, experts}, on);
    auto scores = torch::empty({tokens, experts}, on.dtype(torch::kFloat32));
    auto map = torch::empty({tokens, experts}, on.dtype(torch::kBool));
    auto aux_map = torch::empty({tokens, experts}, on.dtype(torch::kBool));
    auto counts = torch::zeros({experts}, on.dtype(torch::kInt64));
    auto aux_counts = torch::zeros({experts}, on.dtype(torch::kFloat32));
    kernels::TopkSoftmaxArgs a;
    a.logits = logits.data_ptr();
    a.logits_bf16 = logits.scalar_type() == torch::kBFloat16;
    a.tokens = tokens;
    a.experts = experts;
    a.topk = topk;
    a.pre_softmax = pre_softmax;
    a.scaling_factor = float(scaling_factor);
    a.probs = probs.data_ptr();
    a.map = map.data_ptr<bool>();
    a.counts = counts.data_ptr<int64_t>();
    a.scores = scores.data_ptr<float>();
    a.aux_map = aux_map.data_ptr<bool>();
    a.aux_counts = aux_counts.data_ptr<float>();
    kernels::topk_softmax_routing(a, at::cuda::getCurrentCUDAStream(logits.device().index()).stream());
    ctx->save_for_backward({scores, map});
    ctx->saved_data["pre_softmax"] = pre_softmax;
    ctx->saved_data["scaling_factor"] = scaling_factor;
    ctx->saved_data["dtype"] = int64_t(logits.scalar_type());
    ctx->mark_non_differentiable({map, counts, aux_map, aux_counts});
    return {probs, scores, map, counts, aux_map, aux_counts};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto& scores = saved[0];
    const auto& map = saved[1];
    const double scale = ctx->saved_data["scaling_factor"].toDouble();
    torch::Tensor dlogits;
    auto add = [&](const torch::Tensor& d) { dlogits = dlogits.defined() ? dlogits + d : d; };
    if (grads[0].defined()) {
      // The probs' gradient reaches the selected experts only (torch's path: the scatter's backward).
      auto g = grads[0].to(torch::kFloat32) * map;
      if (scale != 1.0) g = g * scale;
      if (ctx->saved_data["pre_softmax"].toBool()) {
        add(softmax_backward(scores, g));  // probs = the softmax over all experts, at the selected ones
      } else {
        // The softmax over the k selected logits is the full softmax renormalised over them.
        auto selected = scores * map;
        add(softmax_backward(selected / selected.sum(-1, true), g));
      }
    }
    if (grads[1].defined()) add(softmax_backward(scores, grads[1].to(torch::kFloat32)));
    if (dlogits.defined()) dlogits = dlogits.to(torch::Dtype(ctx->saved_data["dtype"].toInt()));
    return {dlogits, {}, {}, {}};
  }
};

}  // namespace

bool fused_routing_applies(const torch::Tensor& logits, const TopKOptions& o) {
  const bool dtype_ok = logits.scalar_type() == torch::kFloat32 || logits.scalar_type() == torch::kBFloat16;
  return logits.is_cuda() && logits.dim() == 2 && dtype_ok && o.score_function == MoeScoreFunction::kSoftmax &&
         !o.group_topk && o.topk >= 1 && o.topk <= kernels::kMaxFusedTopk && o.topk <= logits.size(1);
}

FusedRouting fused_topk_softmax(const torch::Tensor& logits, const TopKOptions& o) {
  FP8TRON_CHECK(fused_routing_applies(logits, o), "fused top-k routing: unsupported case");
  const double scale = o.scaling_factor && *o.scaling_factor != 0.0 ? *o.scaling_factor : 1.0;
  auto out = FusedTopkSoftmax::apply(logits, o.topk, o.pre_softmax, scale);
  FusedRouting f;
  f.routing = Routing{out[0], out[2], out[3]};
  f.aux = AuxScores{out[1], out[4], out[5]};
  return f;
}

}  // namespace fp8tron::moe
