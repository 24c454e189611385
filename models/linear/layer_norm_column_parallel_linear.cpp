#include "models/linear/layer_norm_column_parallel_linear.h"

#include "core/error.h"
#include "fp8/fp8_linear.h"
#include "models/linear/column_parallel_linear.h"
#include "models/linear/norm_linear.h"
#include "models/linear/overlapped_linear.h"
#include "models/norm/te_layer_norm.h"

namespace fp8tron {

TELayerNormColumnParallelLinearImpl::TELayerNormColumnParallelLinearImpl(const NormOptions& n, const LinearOptions& l,
                                                                         const ModuleFactory& f)
    : norm_options(n), linear_options(l), tp(f.tp()), main_grads(f.main_grads()) {
  // The norm runs on sequence shards under SP: its gradients are partial per rank.
  add_norm_params(*this, n, tp.sequence_parallel && tp.size > 1, f, "layer_norm_", layer_norm_weight, layer_norm_bias);
  const ParamInfo w = split_param({l.out_features, l.in_features}, 0, l.interleave);
  weight = add_param("weight", f.normal(l.init_name + ".weight", w, l.init_std), w);
  if (l.bias) {
    const ParamInfo b = split_param({l.out_features}, 0, l.interleave);
    bias = add_param("bias", f.constant(b, 0.0), b);
  }
  fp8_site = fp8_site_for(l, f, l.out_features / tp.size, l.in_features);
  if (fp8_site) {
    fp8_site->parameter = weight;
    // The norm an FP8 cast fuses runs its backward through the residual-norm kernel.
    f.fp8()->use_backward_kernels(&fp8_norm_backward, nullptr);
  }
  hold_wgrad(l.delay_wgrad, f, weight, fp8_site.get(), bias);
  plan_ = resolve_linear_plan({LinearRole::kNormColumn, l.init_name, l.bias, fp8_site != nullptr, false}, tp,
                              main_grads->fusion());
}

std::optional<NormPrologue> TELayerNormColumnParallelLinearImpl::fusable_norm(const ResidualStream& in) const {
  if (plan_.norm != NormPlacement::kNormLinearOp) return std::nullopt;
  NormPrologue norm{norm_options, layer_norm_weight, layer_norm_bias};
  if (!norm_prologue_applies(in.residual, in.branch, norm, in.branch_bias)) return std::nullopt;
  return norm;
}

std::optional<NormPrologue> TELayerNormColumnParallelLinearImpl::norm_linear_fits(const ResidualStream& in) const {
  auto norm = fusable_norm(in);
  if (norm && norm_linear_applies(in, *norm, weight, *main_grads)) return norm;
  return std::nullopt;
}

torch::Tensor TELayerNormColumnParallelLinearImpl::forward(const torch::Tensor& x) {
  switch (plan_.norm) {
    case NormPlacement::kFp8Cast:
      // The norm fused into the cast of the local shard (before the all-gather) where the FP8
      // kernels take the tensors (the native delayed recipe, bf16, training); else the norm first.
      if (fused_norm_cast_available(*fp8_site, x, layer_norm_weight, layer_norm_bias))
        return overlapped_norm_fp8_linear(x, norm_options, layer_norm_weight, layer_norm_bias, weight, bias, *fp8_site,
                                          tp, plan_.overlap);
      return overlapped_column_linear(apply_norm(x, norm_options, layer_norm_weight, layer_norm_bias, main_grads), weight,
                                      bias, fp8_site, tp, plan_.overlap);
    case NormPlacement::kNormLinearOp:
      if (const auto norm = norm_linear_fits(ResidualStream{x, {}}))
        return norm_linear(ResidualStream{x, {}}, *norm, weight, bias, main_grads).out;
      break;
    case NormPlacement::kResidualNormKernel:
      if (plan_.overlapped())
        return overlapped_column_linear(apply_norm(x, norm_options, layer_norm_weight, layer_norm_bias, main_grads),
                                        weight, bias, fp8_site, tp, plan_.overlap);
      break;
    case NormPlacement::kNone: FP8TRON_CHECK(false, "a norm-fused linear without a norm");
  }
  // forward() must give forward_residual's bits: recomputed units call it.
  return rank_linear(gemm_input(x), weight, bias, fp8_site, main_grads, norm_rebuild(x));
}

torch::Tensor TELayerNormColumnParallelLinearImpl::gemm_input(const torch::Tensor& x) {
  return enter_tensor_parallel(apply_norm(x, norm_options, layer_norm_weight, layer_norm_bias, main_grads), tp);
}

ResidualOutput TELayerNormColumnParallelLinearImpl::forward_residual(const ResidualStream& in) {
  if (plan_.overlapped()) {
    const auto x = in.sum(main_grads);
    return {x, forward(x)};
  }
  if (const auto norm = norm_linear_fits(in)) return norm_linear(in, *norm, weight, bias, main_grads);
  // forward()'s last two steps with the add fused into the norm. Under sequence parallelism the
  // norm runs on this rank's sequence shard before the all-gather, as forward()'s does.
  const auto g = gemm_input_residual(in);
  return {g.sum, rank_linear(g.out, weight, bias, fp8_site, main_grads, norm_rebuild(g.sum))};
}

// --fp8-transposes recast: the FP8 linear casts its input's transposed copy in backward from the
// norm of `sum`, which the norm's backward keeps anyway (apply_norm gives the fused add + norm's
// bits); where the input is the norm's output as is (no sequence-parallel all-gather). With
// --no-fp8-wgrad its bf16 wgrad reads that norm output instead of a kept bf16 copy.
fp8::InputRebuild TELayerNormColumnParallelLinearImpl::norm_rebuild(const torch::Tensor& sum) const {
  if (!fp8_site || (tp.sequence_parallel && tp.size > 1)) return {};
  const fp8::Fp8EngineOptions& o = fp8_site->engine->options();
  if (o.keep_transposes && o.fp8_wgrad) return {};
  return [sum = sum.detach(), options = norm_options, gamma = layer_norm_weight.detach(),
          beta = layer_norm_bias.defined() ? layer_norm_bias.detach() : torch::Tensor(), grads = main_grads] {
    return apply_norm(sum, options, gamma, beta, grads);
  };
}

ResidualOutput TELayerNormColumnParallelLinearImpl::gemm_input_residual(const ResidualStream& in) {
  const auto r = residual_add_norm(in.residual, in.branch, norm_options, layer_norm_weight, layer_norm_bias,
                                   in.branch_bias, main_grads);
  return {r.sum, enter_tensor_parallel(r.normed, tp)};
}

}  // namespace fp8tron
