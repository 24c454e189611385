#include "models/linear/column_parallel_linear.h"

#include "core/error.h"
#include "fp8/fp8_linear.h"
#include "models/linear/fused_linear.h"
#include "models/linear/overlapped_linear.h"

namespace fp8tron {

torch::Tensor enter_tensor_parallel(const torch::Tensor& x, const TensorParallelContext& tp) {
  return tp.sequence_parallel ? gather_from_sp(x, *tp.comm) : copy_to_tp(x, *tp.comm);
}

torch::Tensor rank_linear(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b,
                          const std::shared_ptr<fp8::Fp8Site>& site, const MainGradsPtr& main_grads,
                          const fp8::InputRebuild& rebuild_x) {
  return site ? fp8::fp8_linear(x, w, b, *site, fp8::Prologue::kNone, rebuild_x)
              : linear_with_grad_accumulation_fusion(x, w, b, main_grads);
}

TEColumnParallelLinearImpl::TEColumnParallelLinearImpl(const LinearOptions& o, const ModuleFactory& f)
    : options(o), tp(f.tp()), main_grads(f.main_grads()) {
  const ParamInfo w = split_param({o.out_features, o.in_features}, 0, o.interleave);
  if (!o.external_weight) weight = add_param("weight", f.normal(o.init_name + ".weight", w, o.init_std), w);
  if (o.bias) {
    const ParamInfo b = split_param({o.out_features}, 0, o.interleave);
    bias = add_param("bias", f.constant(b, 0.0), b);
  }
  fp8_site = fp8_site_for(o, f, o.out_features / tp.size, o.in_features);
  if (fp8_site) fp8_site->parameter = weight;
  hold_wgrad(o.delay_wgrad, f, weight, fp8_site.get(), bias);
  plan_ = resolve_linear_plan({LinearRole::kColumn, o.init_name, o.bias, fp8_site != nullptr, false}, tp,
                              main_grads->fusion());
}

torch::Tensor TEColumnParallelLinearImpl::forward(const torch::Tensor& x) { return forward_with(x, weight); }

torch::Tensor TEColumnParallelLinearImpl::forward_with(const torch::Tensor& x, const torch::Tensor& w) {
  switch (plan_.path) {
    case LinearPath::kOverlapped:
    case LinearPath::kOverlappedFp8: return overlapped_column_linear(x, w, bias, fp8_site, tp, plan_.overlap);
    case LinearPath::kPlain:
      if (wgrad_deferral && is_training()) return wgrad_deferral->linear(enter_tensor_parallel(x, tp), w);
      [[fallthrough]];
    case LinearPath::kFp8: return rank_linear(enter_tensor_parallel(x, tp), w, bias, fp8_site, main_grads);
  }
  FP8TRON_CHECK(false, "unknown linear path");
}

}  // namespace fp8tron
