#include "models/linear/modules.h"

#include <algorithm>

#include "core/error.h"
#include "fp8/fp8_linear.h"
#include "fp8/swiglu_backward.h"
#include "models/mlp/fused_gelu_mlp.h"
#include "models/linear/fused_linear.h"
#include "models/mlp/fused_swiglu.h"
#include "models/linear/linear_kernels_fp8.h"
#include "models/linear/linear_kernels_plain.h"
#include "models/linear/norm_linear.h"
#include "parallel/tensor_parallel.h"

namespace fp8tron {

int64_t layer_number(const std::string& name) {
  const std::string prefix = "decoder.layers.";
  if (name.rfind(prefix, 0) != 0) return -1;
  return std::stoll(name.substr(prefix.size()));
}

int64_t per_layer_index(const std::string& name) {
  const std::string mtp = "mtp.layers.";
  if (name.rfind(mtp, 0) == 0) return std::stoll(name.substr(mtp.size()));
  return std::max<int64_t>(layer_number(name), 0);
}

namespace {
ParamInfo replicated(std::vector<int64_t> shape, bool partial_grads) {
  ParamInfo info;
  info.global_shape = std::move(shape);
  info.reduce_grad_over_tp = partial_grads;
  return info;
}
ParamInfo split(std::vector<int64_t> shape, int dim, int interleave = 1) {
  ParamInfo info;
  info.global_shape = std::move(shape);
  info.partition_dim = dim;
  info.interleave = interleave;
  return info;
}
// Norm parameters: gamma starts at 1 (0 when stored zero-centred), beta at 0.
void add_norm_params(ShardedModule& m, const NormOptions& o, bool partial_grads, const ModuleFactory& f,
                     const std::string& prefix, torch::Tensor& weight, torch::Tensor& bias) {
  const ParamInfo info = replicated({o.size}, partial_grads);
  weight = m.add_param(prefix + "weight", f.constant(info, o.zero_centered_gamma ? 0.0 : 1.0), info);
  if (o.kind == Normalization::LayerNorm) bias = m.add_param(prefix + "bias", f.constant(info, 0.0), info);
}
// Enters the tensor-parallel region: all-gather of sequence shards (SP) or identity with an
// all-reduce in backward.
torch::Tensor enter_tp(const torch::Tensor& x, const TensorParallelContext& tp) {
  return tp.sequence_parallel ? gather_from_sp(x, *tp.comm) : copy_to_tp(x, *tp.comm);
}
// Registers the linear with the FP8 engine when there is one; [out, in] are this rank's features.
std::shared_ptr<fp8::Fp8Site> fp8_site_for(const LinearOptions& o, const ModuleFactory& f, int64_t out, int64_t in) {
  if (!f.fp8() || !o.fp8) return nullptr;
  return f.fp8()->add_site(o.init_name, layer_number(o.init_name), out, in);
}
void attach_weight(const std::shared_ptr<fp8::Fp8Site>& site, const torch::Tensor& weight) {
  if (site) site->parameter = weight;
}
torch::Tensor linear(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b,
                     const std::shared_ptr<fp8::Fp8Site>& site) {
  return site ? fp8::fp8_linear(x, w, b, *site) : linear_with_grad_accumulation_fusion(x, w, b);
}
// Whether the module named `name` runs as the communicating op, and with which plan: only under
// sequence parallelism over more than one rank (the validation rules require it of the flags).
bool overlap_plan_for(const TensorParallelContext& tp, const std::string& name, overlap::TpLinearPlan* plan) {
  return tp.size > 1 && tp.sequence_parallel && tp.overlap && overlap::plan_for_module(*tp.overlap, name, plan);
}
// The GEMM functor of one call of an overlapped linear.
std::shared_ptr<overlap::LinearKernels> kernels_for(const torch::Tensor& w, const torch::Tensor& b,
                                                    const std::shared_ptr<fp8::Fp8Site>& site,
                                                    const TensorParallelContext& tp, const overlap::TpLinearPlan& plan,
                                                    fp8::Prologue prologue = fp8::Prologue::kNone) {
  if (site) return std::make_shared<Fp8LinearKernels>(w, b, *site, *tp.comm, plan, prologue);
  return std::make_shared<PlainLinearKernels>(w, b);
}
torch::Tensor overlapped_column(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b,
                                const std::shared_ptr<fp8::Fp8Site>& site, const TensorParallelContext& tp,
                                const overlap::TpLinearPlan& plan) {
  return overlap::tp_linear(x, w, b, {}, kernels_for(w, b, site, tp, plan), plan, *tp.comm, w.size(0));
}
}  // namespace

TELayerNormImpl::TELayerNormImpl(const NormOptions& o, bool partial_grads, const ModuleFactory& f) : options(o) {
  add_norm_params(*this, o, partial_grads && f.tp().size > 1, f, "", weight, bias);
}
torch::Tensor TELayerNormImpl::forward(const torch::Tensor& x) { return apply_norm(x, options, weight, bias); }
ResidualNormOutput TELayerNormImpl::forward_residual(const ResidualStream& in) {
  return residual_add_norm(in.residual, in.branch, options, weight, bias, in.branch_bias);
}

TEColumnParallelLinearImpl::TEColumnParallelLinearImpl(const LinearOptions& o, const ModuleFactory& f) : options(o), tp(f.tp()) {
  const ParamInfo w = split({o.out_features, o.in_features}, 0, o.interleave);
  if (!o.external_weight) weight = add_param("weight", f.normal(o.init_name + ".weight", w, o.init_std), w);
  if (o.bias) {
    const ParamInfo b = split({o.out_features}, 0, o.interleave);
    bias = add_param("bias", f.constant(b, 0.0), b);
  }
  fp8_site = fp8_site_for(o, f, o.out_features / tp.size, o.in_features);
  attach_weight(fp8_site, weight);
  overlapped = overlap_plan_for(tp, o.init_name, &overlap_plan);
}
torch::Tensor TEColumnParallelLinearImpl::forward(const torch::Tensor& x) { return forward_with(x, weight); }
torch::Tensor TEColumnParallelLinearImpl::forward_with(const torch::Tensor& x, const torch::Tensor& w) {
  if (overlapped) return overlapped_column(x, w, bias, fp8_site, tp, overlap_plan);
  return linear(enter_tp(x, tp), w, bias, fp8_site);
}

TELayerNormColumnParallelLinearImpl::TELayerNormColumnParallelLinearImpl(const NormOptions& n, const LinearOptions& l,
                                                                         const ModuleFactory& f)
    : norm_options(n), linear_options(l), tp(f.tp()) {
  // The norm runs on sequence shards under SP: its gradients are partial per rank.
  add_norm_params(*this, n, tp.sequence_parallel && tp.size > 1, f, "layer_norm_", layer_norm_weight, layer_norm_bias);
  const ParamInfo w = split({l.out_features, l.in_features}, 0, l.interleave);
  weight = add_param("weight", f.normal(l.init_name + ".weight", w, l.init_std), w);
  if (l.bias) {
    const ParamInfo b = split({l.out_features}, 0, l.interleave);
    bias = add_param("bias", f.constant(b, 0.0), b);
  }
  fp8_site = fp8_site_for(l, f, l.out_features / tp.size, l.in_features);
  attach_weight(fp8_site, weight);
  // The norm FP8 fuses into the input's cast runs its backward through our kernel.
  if (fp8_site) fp8::install_norm_backward(&fp8_norm_backward);
  overlapped = overlap_plan_for(tp, l.init_name, &overlap_plan);
}
torch::Tensor TELayerNormColumnParallelLinearImpl::forward(const torch::Tensor& x) {
  // FP8 without the overlap runs our norm kernel and then the GEMM's input cast, not the norm fused
  // into the cast (fp8::fp8_norm_linear): the norm kernel also takes the residual add each way
  // (forward_residual), which saves the separate bf16 residual adds and measured 0.5-1.1% faster on
  // an H200, and forward() must give forward_residual's bits (recomputed units call it).
  if (overlapped) {
    // Under TP the overlapped op fuses the norm into the cast of the local shard (before the
    // all-gather) where the FP8 kernels can; elsewhere the norm runs first, on the shard.
    if (fp8_site && fused_norm_cast_available(*fp8_site, x, layer_norm_weight, layer_norm_bias)) {
      auto kernels = std::make_shared<Fp8LinearKernels>(weight, bias, *fp8_site, *tp.comm, overlap_plan, fp8::Prologue::kNone);
      kernels->fuse_norm(norm_options.kind == Normalization::RMSNorm, layer_norm_weight, layer_norm_bias,
                         norm_options.epsilon, norm_options.zero_centered_gamma);
      std::vector<torch::Tensor> norm_params = {layer_norm_weight};
      if (layer_norm_bias.defined()) norm_params.push_back(layer_norm_bias);
      return overlap::tp_linear(x, weight, bias, norm_params, kernels, overlap_plan, *tp.comm, weight.size(0));
    }
    return overlapped_column(apply_norm(x, norm_options, layer_norm_weight, layer_norm_bias), weight, bias, fp8_site, tp,
                             overlap_plan);
  }
  const ResidualStream stream{x, {}};
  if (const auto norm = fusable_norm(stream); norm && norm_linear_applies(stream, *norm, weight))
    return norm_linear(stream, *norm, weight, bias).out;
  return linear(gemm_input(x), weight, bias, fp8_site);
}
std::optional<NormPrologue> TELayerNormColumnParallelLinearImpl::fusable_norm(const ResidualStream& in) const {
  if (fp8_site || overlapped || tp.size != 1) return std::nullopt;
  NormPrologue norm{norm_options, layer_norm_weight, layer_norm_bias};
  if (!norm_prologue_applies(in.residual, in.branch, norm, in.branch_bias)) return std::nullopt;
  return norm;
}
torch::Tensor TELayerNormColumnParallelLinearImpl::gemm_input(const torch::Tensor& x) {
  return enter_tp(apply_norm(x, norm_options, layer_norm_weight, layer_norm_bias), tp);
}
ResidualOutput TELayerNormColumnParallelLinearImpl::forward_residual(const ResidualStream& in) {
  if (overlapped) {
    const auto x = in.sum();
    return {x, forward(x)};
  }
  if (const auto norm = fusable_norm(in); norm && norm_linear_applies(in, *norm, weight))
    return norm_linear(in, *norm, weight, bias);
  // forward()'s last two lines with the add fused into the norm. Under sequence parallelism the
  // norm runs on this rank's sequence shard before the all-gather, as forward()'s does.
  const auto g = gemm_input_residual(in);
  return {g.sum, linear(g.out, weight, bias, fp8_site)};
}
ResidualOutput TELayerNormColumnParallelLinearImpl::gemm_input_residual(const ResidualStream& in) {
  const auto r = residual_add_norm(in.residual, in.branch, norm_options, layer_norm_weight, layer_norm_bias, in.branch_bias);
  return {r.sum, enter_tp(r.normed, tp)};
}

TERowParallelLinearImpl::TERowParallelLinearImpl(const LinearOptions& o, const ModuleFactory& f) : options(o), tp(f.tp()) {
  const ParamInfo w = split({o.out_features, o.in_features}, 1);
  weight = add_param("weight", f.normal(o.init_name + ".weight", w, o.init_std), w);
  if (o.bias) {
    // Added after the reduction; under SP each rank adds it to its own sequence shard.
    const ParamInfo b = replicated({o.out_features}, tp.sequence_parallel && tp.size > 1);
    bias = add_param("bias", f.constant(b, 0.0), b);
  }
  fp8_site = fp8_site_for(o, f, o.out_features, o.in_features / tp.size);
  attach_weight(fp8_site, weight);
  // The SwiGLU that FP8 fuses into this input's cast runs its backward through our kernel (where fc1's
  // gradient cast does not take it over).
  if (fp8_site) fp8::install_swiglu_backward(&fused_swiglu_backward);
  overlapped = overlap_plan_for(tp, o.init_name, &overlap_plan);
}
DeferredBiasOutput TERowParallelLinearImpl::forward_gelu(const torch::Tensor& x, bool defer_bias) {
  if (!fp8_site) return forward_deferring_bias(at::gelu(x, "tanh"), defer_bias);
  if (overlapped) return {forward_overlapped(x, fp8::Prologue::kGeluTanh), {}};
  return {reduce_and_add_bias(fp8::fp8_linear(x, weight, own_bias(), *fp8_site, fp8::Prologue::kGeluTanh)), {}};
}
DeferredBiasOutput TERowParallelLinearImpl::forward_fused_gelu_mlp(const torch::Tensor& x, const torch::Tensor& fc1_weight,
                                                                   const torch::Tensor& fc1_bias, bool defer_bias) {
  const bool deferred = defers_bias(x, defer_bias);
  return output(fused_gelu_mlp(x, GeluMlpParams{fc1_weight, fc1_bias, weight, own_bias(deferred)}), deferred);
}
ResidualOutput TERowParallelLinearImpl::forward_fused_norm_gelu_mlp(const ResidualStream& in, const NormPrologue& fc1_norm,
                                                                    const torch::Tensor& fc1_weight,
                                                                    const torch::Tensor& fc1_bias, bool defer_bias) {
  const bool deferred = defers_bias(in.residual, defer_bias);
  const auto r = fused_norm_gelu_mlp(in, fc1_norm, GeluMlpParams{fc1_weight, fc1_bias, weight, own_bias(deferred)});
  const auto y = output(r.out, deferred);
  return {r.sum, y.out, y.bias};
}
bool TERowParallelLinearImpl::fused_gelu_mlp_applies(const torch::Tensor& x, const torch::Tensor& fc1_weight,
                                                     const torch::Tensor& fc1_bias) const {
  return !fp8_site && !overlapped && fused_gelu_mlp_blocker(x, GeluMlpParams{fc1_weight, fc1_bias, weight, own_bias()}).empty();
}
DeferredBiasOutput TERowParallelLinearImpl::forward_swiglu(const torch::Tensor& x, bool defer_bias) {
  if (!fp8_site && !overlapped) {
    const bool deferred = defers_bias(x, defer_bias);
    return output(swiglu_linear(x, weight, own_bias(deferred)), deferred);
  }
  if (!fp8_site) return {forward(fused_swiglu(x)), {}};
  if (overlapped) return {forward_overlapped(x, fp8::Prologue::kSwiglu), {}};
  return {reduce_and_add_bias(fp8::fp8_linear(x, weight, own_bias(), *fp8_site, fp8::Prologue::kSwiglu)), {}};
}
torch::Tensor TERowParallelLinearImpl::forward(const torch::Tensor& x) {
  if (overlapped) return forward_overlapped(x, fp8::Prologue::kNone);
  return reduce_and_add_bias(linear(x, weight, own_bias(), fp8_site));
}
DeferredBiasOutput TERowParallelLinearImpl::forward_deferring_bias(const torch::Tensor& x, bool defer_bias) {
  if (!defers_bias(x, defer_bias)) return {forward(x), {}};
  return output(linear(x, weight, {}, fp8_site), true);
}
torch::Tensor TERowParallelLinearImpl::forward_overlapped(const torch::Tensor& x, fp8::Prologue prologue) {
  auto kernels = kernels_for(weight, {}, fp8_site, tp, overlap_plan, prologue);
  auto y = overlap::tp_linear(x, weight, {}, {}, kernels, overlap_plan, *tp.comm, weight.size(0));
  return bias.defined() ? y + bias : y;
}
torch::Tensor TERowParallelLinearImpl::own_bias(bool deferred) const {
  // One rank holds the whole sum: the bias rides in the GEMM's epilogue (and its gradient comes
  // from the GEMM's backward) instead of a separate add after the reduction.
  return tp.size == 1 && !deferred ? bias : torch::Tensor();
}
torch::Tensor TERowParallelLinearImpl::reduce_and_add_bias(const torch::Tensor& partial, bool deferred) {
  if (tp.size == 1) return partial;
  auto y = tp.sequence_parallel ? reduce_scatter_to_sp(partial, *tp.comm) : reduce_from_tp(partial, *tp.comm);
  return bias.defined() && !deferred ? y + bias : y;
}
bool TERowParallelLinearImpl::defers_bias(const torch::Tensor& x, bool defer_bias) const {
  // The CPU keeps the bias in the GEMM: its results stay those of the unfused model. Under tensor
  // parallelism the bias stays after the reduction (not yet run on several GPUs deferred).
  return defer_bias && bias.defined() && !fp8_site && !overlapped && tp.size == 1 && x.is_cuda();
}
DeferredBiasOutput TERowParallelLinearImpl::output(const torch::Tensor& partial, bool deferred) {
  return {reduce_and_add_bias(partial, deferred), deferred ? bias : torch::Tensor()};
}

namespace {
void add_defined(std::vector<torch::Tensor>& out, const torch::Tensor& weight, const torch::Tensor& bias) {
  if (weight.defined()) out.push_back(weight);
  if (bias.defined()) out.push_back(bias);
}
}  // namespace

std::vector<torch::Tensor> gemm_written_params(const torch::nn::Module& model) {
  std::vector<torch::Tensor> params;
  for (const auto& m : model.modules(/*include_self=*/false)) {
    if (const auto* c = dynamic_cast<const TEColumnParallelLinearImpl*>(m.get())) {
      if (!c->fp8_site && !c->overlapped && !c->options.external_weight) add_defined(params, c->weight, c->bias);
    } else if (const auto* n = dynamic_cast<const TELayerNormColumnParallelLinearImpl*>(m.get())) {
      if (!n->fp8_site && !n->overlapped) add_defined(params, n->weight, n->bias);
    } else if (const auto* r = dynamic_cast<const TERowParallelLinearImpl*>(m.get())) {
      // With tensor parallelism the bias is added after the reduction, by autograd.
      if (!r->fp8_site && !r->overlapped) add_defined(params, r->weight, r->tp.size == 1 ? r->bias : torch::Tensor());
    }
  }
  return params;
}

}  // namespace fp8tron
