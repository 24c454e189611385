#include "models/moe/experts.h"

#include <cmath>

#include "models/init_methods.h"
#include "models/mlp/fused_swiglu.h"
#include "models/recompute/activation_offload.h"
#include "models/recompute/output_discarding_recompute.h"

namespace fp8tron {

GroupedMlpImpl::GroupedMlpImpl(const ModelConfig& m, const std::string& prefix, int64_t num_local_experts,
                               int64_t expert_offset, const ModuleFactory& f, bool use_fp8)
    : swiglu_(m.swiglu),
      recompute_activation_(m.recompute.selective(&RecomputeModules::moe_act)),
      offload_fc1_(m.offload.on(&OffloadModules::expert_fc1) ? f.offloader().get() : nullptr),
      offload_act_(m.offload.on(&OffloadModules::moe_act) ? f.offloader().get() : nullptr) {
  const int64_t ffn = m.moe.ffn_hidden_size;
  GroupedLinearOptions fc1;
  fc1.in_features = m.hidden_size;
  fc1.out_features = m.swiglu ? 2 * ffn : ffn;
  fc1.num_gemms = num_local_experts;
  fc1.expert_offset = expert_offset;
  fc1.is_expert = true;
  fc1.bias = m.add_bias_linear;
  fc1.init_std = hidden_init_std(m);
  fc1.init_name = prefix + ".linear_fc1";
  fc1.parallel_mode = GroupedParallelMode::kColumn;
  fc1.interleave = m.swiglu ? 2 : 1;
  fc1.use_fp8 = use_fp8;
  GroupedLinearOptions fc2 = fc1;
  fc2.in_features = ffn;
  fc2.out_features = m.hidden_size;
  fc2.init_std = output_layer_init_std(m);  // Megatron's output_layer_init_method
  fc2.init_name = prefix + ".linear_fc2";
  fc2.parallel_mode = GroupedParallelMode::kRow;
  fc2.interleave = 1;
  linear_fc1 = register_module("linear_fc1", TEGroupedLinear(fc1, f));
  linear_fc2 = register_module("linear_fc2", TEGroupedLinear(fc2, f));
}

torch::Tensor GroupedMlpImpl::activation(const torch::Tensor& h) const {
  if (!swiglu_) return at::gelu(h, "tanh");
  // This rank's [gate | up] shards (fc1 splits each half over the expert TP group).
  return fused_swiglu(h);
}

torch::Tensor GroupedMlpImpl::forward(const torch::Tensor& x, const std::vector<int64_t>& counts,
                                      const torch::Tensor& packed_x) {
  // --offload-modules expert_fc1: fc1's input rows, which bf16 experts keep for their weight
  // gradient (FP8 experts keep a transposed FP8 copy made inside their node instead, and nothing of
  // x or of --moe-dispatch-fp8's packed rows: nothing to offload); moe_act: fc1's output, offloaded
  // once fc2 (which may fuse the activation) ran.
  auto* fc1_offload = linear_fc1->fp8_sites.empty() ? offload_fc1_ : nullptr;
  auto h = offloaded_call(fc1_offload, "expert_fc1", {x}, [&] { return linear_fc1(x, counts, packed_x); });
  return offloaded_call(offload_act_, "moe_act", {h}, [&] { return activation_and_fc2(h, counts); });
}

torch::Tensor GroupedMlpImpl::activation_and_fc2(const torch::Tensor& h, const std::vector<int64_t>& counts) {
  // FP8 experts with delayed scaling: the SwiGLU runs inside fc2's input cast and its output is
  // never stored (moe_act recomputation, which would discard it, is refused with delayed scaling).
  if (swiglu_ && linear_fc2->fuses_swiglu()) return linear_fc2->forward_swiglu(h, counts);
  if (!recompute_activation_ || !is_training()) return linear_fc2(activation(h), counts);
  OutputDiscardingRecompute checkpoint;
  // Called again in backward: captures `this` (the model outlives its graphs).
  auto a = checkpoint.run_one([this](const torch::Tensor& in) { return activation(in); }, h);
  auto out = linear_fc2(a, counts);
  checkpoint.discard(out);
  return out;
}

}  // namespace fp8tron
