#include "models/linear/row_parallel_linear.h"

#include "core/error.h"
#include "fp8/fp8_linear.h"
#include "models/linear/column_parallel_linear.h"
#include "models/linear/overlapped_linear.h"
#include "models/mlp/fused_gelu_mlp.h"
#include "models/mlp/fused_swiglu.h"
#include "parallel/tensor_parallel.h"

namespace fp8tron {

TERowParallelLinearImpl::TERowParallelLinearImpl(const LinearOptions& o, const ModuleFactory& f)
    : options(o), tp(f.tp()), main_grads(f.main_grads()) {
  const ParamInfo w = split_param({o.out_features, o.in_features}, 1);
  weight = add_param("weight", f.normal(o.init_name + ".weight", w, o.init_std), w);
  if (o.bias) {
    // Added after the reduction; under SP each rank adds it to its own sequence shard.
    const ParamInfo b = replicated_param({o.out_features}, tp.sequence_parallel && tp.size > 1);
    bias = add_param("bias", f.constant(b, 0.0), b);
  }
  fp8_site = fp8_site_for(o, f, o.out_features, o.in_features / tp.size);
  if (fp8_site) {
    fp8_site->parameter = weight;
    // The SwiGLU an FP8 cast fuses runs its backward through our kernel (where fc1's gradient cast
    // does not take it over).
    f.fp8()->use_backward_kernels(nullptr, &fused_swiglu_backward);
  }
  hold_wgrad(o.delay_wgrad, f, weight, fp8_site.get(), bias);
  plan_ = resolve_linear_plan({LinearRole::kRow, o.init_name, o.bias, fp8_site != nullptr, o.defer_bias}, tp,
                              main_grads->fusion());
}

torch::Tensor TERowParallelLinearImpl::forward(const torch::Tensor& x, const fp8::InputRebuild& rebuild_x) {
  switch (plan_.path) {
    case LinearPath::kOverlapped:
    case LinearPath::kOverlappedFp8:
      return overlapped_row_linear(x, weight, bias, fp8_site, tp, plan_.overlap, fp8::Prologue::kNone);
    case LinearPath::kPlain:
    case LinearPath::kFp8: return reduce_and_add_bias(rank_linear(x, weight, own_bias(), fp8_site, main_grads, rebuild_x));
  }
  FP8TRON_CHECK(false, "unknown linear path");
}

DeferredBiasOutput TERowParallelLinearImpl::forward_deferring_bias(const torch::Tensor& x, bool defer_bias,
                                                                  const fp8::InputRebuild& rebuild_x) {
  if (!defers_bias(x, defer_bias)) return {forward(x, rebuild_x), {}};
  return output(rank_linear(x, weight, {}, fp8_site, main_grads, rebuild_x), true);
}

torch::Tensor TERowParallelLinearImpl::fp8_forward(const torch::Tensor& x, fp8::Prologue prologue) {
  if (plan_.path == LinearPath::kOverlappedFp8)
    return overlapped_row_linear(x, weight, bias, fp8_site, tp, plan_.overlap, prologue);
  return reduce_and_add_bias(fp8::fp8_linear(x, weight, own_bias(), *fp8_site, prologue));
}

DeferredBiasOutput TERowParallelLinearImpl::forward_gelu(const torch::Tensor& x, bool defer_bias) {
  if (plan_.fp8()) return {fp8_forward(x, fp8::Prologue::kGeluTanh), {}};
  return forward_deferring_bias(at::gelu(x, "tanh"), defer_bias);
}

DeferredBiasOutput TERowParallelLinearImpl::forward_swiglu(const torch::Tensor& x, bool defer_bias) {
  switch (plan_.path) {
    case LinearPath::kPlain: {
      const bool deferred = defers_bias(x, defer_bias);
      return output(swiglu_linear(x, weight, own_bias(deferred), main_grads), deferred);
    }
    case LinearPath::kOverlapped: return {forward(fused_swiglu(x)), {}};
    case LinearPath::kFp8:
    case LinearPath::kOverlappedFp8: return {fp8_forward(x, fp8::Prologue::kSwiglu), {}};
  }
  FP8TRON_CHECK(false, "unknown linear path");
}

DeferredBiasOutput TERowParallelLinearImpl::forward_fused_gelu_mlp(const torch::Tensor& x, const torch::Tensor& fc1_weight,
                                                                   const torch::Tensor& fc1_bias, bool defer_bias) {
  const bool deferred = defers_bias(x, defer_bias);
  return output(fused_gelu_mlp(x, GeluMlpParams{fc1_weight, fc1_bias, weight, own_bias(deferred), main_grads}), deferred);
}

ResidualOutput TERowParallelLinearImpl::forward_fused_norm_gelu_mlp(const ResidualStream& in, const NormPrologue& fc1_norm,
                                                                    const torch::Tensor& fc1_weight,
                                                                    const torch::Tensor& fc1_bias, bool defer_bias) {
  const bool deferred = defers_bias(in.residual, defer_bias);
  const auto r = fused_norm_gelu_mlp(in, fc1_norm, GeluMlpParams{fc1_weight, fc1_bias, weight, own_bias(deferred), main_grads});
  const auto y = output(r.out, deferred);
  return {r.sum, y.out, y.bias};
}

bool TERowParallelLinearImpl::fused_gelu_mlp_applies(const torch::Tensor& x, const torch::Tensor& fc1_weight,
                                                     const torch::Tensor& fc1_bias) const {
  return plan_.path == LinearPath::kPlain &&
         fused_gelu_mlp_blocker(x, GeluMlpParams{fc1_weight, fc1_bias, weight, own_bias(), main_grads}).empty();
}

torch::Tensor TERowParallelLinearImpl::own_bias(bool deferred) const {
  // One rank holds the whole sum: the bias rides in the GEMM's epilogue (and its gradient comes
  // from the GEMM's backward) instead of a separate add after the reduction.
  return plan_.bias == BiasPlacement::kGemmEpilogue || (plan_.bias == BiasPlacement::kNextNorm && !deferred) ? bias
                                                                                                              : torch::Tensor();
}

torch::Tensor TERowParallelLinearImpl::reduce_and_add_bias(const torch::Tensor& partial, bool deferred) {
  if (tp.size == 1) return partial;
  auto y = tp.sequence_parallel ? reduce_scatter_to_sp(partial, *tp.comm) : reduce_from_tp(partial, *tp.comm);
  return plan_.bias == BiasPlacement::kAfterReduction && !deferred ? y + bias : y;
}

bool TERowParallelLinearImpl::defers_bias(const torch::Tensor& x, bool defer_bias) const {
  return defer_bias && plan_.bias == BiasPlacement::kNextNorm && x.is_cuda();
}

DeferredBiasOutput TERowParallelLinearImpl::output(const torch::Tensor& partial, bool deferred) {
  return {reduce_and_add_bias(partial, deferred), deferred ? bias : torch::Tensor()};
}

}  // namespace fp8tron
