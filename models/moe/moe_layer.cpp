#include "models/moe/moe_layer.h"

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDACachingAllocator.h>

#include "core/error.h"
#include "fp8/fp8_linear.h"
#include "models/recompute/recompute.h"

namespace fp8tron {
namespace {

int64_t router_padding(const ModelConfig& m, const ModuleFactory& f) {
  if (!m.moe.router_padding_for_quantization || !f.fp8()) return 0;
  return fp8::recipe_kind(f.fp8()->recipe()) == fp8::RecipeKind::kMxfp8 ? 32 : 16;
}

}  // namespace

TensorParallelContext expert_tensor_parallel(const MoeContext& context) {
  const auto& g = context.groups();
  return TensorParallelContext{g.expert_tp, g.expert_tp_rank, g.expert_tp->size(), false};
}

MoeLayerImpl::MoeLayerImpl(const ModelConfig& m, const std::string& prefix, int64_t layer, const ModuleFactory& dense,
                           std::shared_ptr<MoeContext> context)
    : context_(std::move(context)) {
  const auto& g = context_->groups();
  const int64_t ep = g.ep->size();
  FP8TRON_CHECK(m.moe.num_experts % ep == 0, "the experts must divide over the expert-parallel ranks");
  const int64_t local = m.moe.num_experts / ep;
  router = register_module("router", TopKRouter(m, prefix + ".router", layer, dense, context_));
  // The model's main gradients: --delay-wgrad-compute's queue holds the experts' gradients too.
  ModuleFactory expert_factory(m.seed, expert_tensor_parallel(*context_), dense.fp8(), {}, dense.main_grads());
  expert_factory.set_offloader(dense.offloader());
  const bool fp8_experts = m.moe.expert_gemm_fp8;  // --no-use-gmm-fp8: bf16 expert GEMMs in an FP8 run
  experts = register_module("experts", GroupedMlp(m, prefix + ".experts", local, int64_t(g.ep_rank) * local, expert_factory,
                                                  fp8_experts));
  if (m.moe.shared_expert_size > 0)
    shared_experts = register_module("shared_experts", SharedExpertMlp(m, prefix + ".shared_experts", dense));
  DispatcherOptions options{m.moe.num_experts, local, router_padding(m, dense), g, context_.get(), nullptr};
  // --moe-dispatch-fp8: where this layer's experts run fc1 in FP8 with a per-block recipe (not kept
  // in bf16 by --first-last-layers-bf16 or --fp8-min-features), the tokens travel as its codes.
  if (m.moe.dispatch_fp8 && m.moe.dispatcher == MoeDispatcher::kAllToAll && experts->takes_packed_input()) {
    options.fp8_dispatch = expert_factory.fp8();
    experts->linear_fc1->input_dispatched_fp8 = true;
  }
  dispatcher_ = make_token_dispatcher(m.moe.dispatcher, options);
  overlap_shared_ = m.moe.shared_expert_overlap && shared_experts;
  recompute_layer_ = m.recompute.selective(&RecomputeModules::moe);
  recompute_shared_ = m.recompute.selective(&RecomputeModules::shared_experts) && shared_experts;
  // Megatron refuses shared_experts recomputation with the overlap (config validation does too).
  FP8TRON_CHECK(!(recompute_shared_ && overlap_shared_), "shared_experts recomputation with the shared expert overlap");
}

torch::Tensor MoeLayerImpl::forward(const torch::Tensor& x) {
  if (!recompute_layer_ || !is_training()) return compute(x);
  // Called again in backward: captures only `this` (the model outlives its graphs).
  return recompute([this](const std::vector<torch::Tensor>& in) { return compute(in[0]); }, {x});
}

torch::Tensor MoeLayerImpl::shared_output(const torch::Tensor& x) {
  if (!recompute_shared_ || !is_training()) return shared_experts(x);
  return recompute([this](const std::vector<torch::Tensor>& in) { return shared_experts(in[0]); }, {x});
}

torch::Tensor MoeLayerImpl::routed(const torch::Tensor& x2d, const moe::Routing& routing) {
  auto dispatched = dispatcher_->dispatch(x2d, routing);
  auto y = experts(dispatched.tokens, dispatched.tokens_per_expert, dispatched.packed);
  return dispatcher_->combine(y);
}

torch::Tensor MoeLayerImpl::compute(const torch::Tensor& x) {
  const auto shape = x.sizes().vec();
  auto x2d = x.reshape({-1, x.size(-1)});
  if (!overlap_shared_ || !x.is_cuda()) {
    // Megatron computes the shared expert first, on the same input, and adds it at the end.
    torch::Tensor shared = shared_experts ? shared_output(x) : torch::Tensor();
    auto routing = router(x);
    auto out = routed(x2d, routing).view(shape);
    return shared.defined() ? out + shared : out;
  }
  // Overlap: the shared expert's forward on a side stream, the dispatch on the current one.
  auto main = c10::cuda::getCurrentCUDAStream(x.device().index());
  auto side = c10::cuda::getStreamFromPool(false, x.device().index());
  at::cuda::CUDAEvent input_ready;
  input_ready.record(main);
  input_ready.block(side);
  torch::Tensor shared;
  {
    c10::cuda::CUDAStreamGuard guard(side);
    shared = shared_experts(x);
  }
  auto routing = router(x);
  auto out = routed(x2d, routing).view(shape);
  at::cuda::CUDAEvent shared_ready;
  shared_ready.record(side);
  shared_ready.block(main);
  // The caching allocator must not reuse the side stream's output before the main stream is done.
  c10::cuda::CUDACachingAllocator::recordStream(shared.storage().data_ptr(), main);
  c10::cuda::CUDACachingAllocator::recordStream(x.storage().data_ptr(), side);
  return out + shared;
}

}  // namespace fp8tron
