// The routed experts of an MoE layer (Megatron-Core's TEGroupedMLP): linear_fc1 and linear_fc2
// as TEGroupedLinear over this rank's local experts, column- and row-parallel over the expert
// tensor-parallel group, with the dense MLP's activation (SwiGLU or GeLU) in between. Parameters
// decoder.layers.N.mlp.experts.linear_fc{1,2}.weight<g> with g the GLOBAL expert index, drawn
// from (seed, name): the same experts in every expert-parallel layout.
//
// FP8: the expert GEMMs run in FP8 through TEGroupedLinear (one site per expert), which pads each
// expert's rows to the FP8 alignment inside (Megatron's TEGroupedMLP/Fp8Padding): unaligned counts
// are never refused and change no output. --no-use-gmm-fp8 keeps them in bf16.
// With delayed scaling on FP8 tensor cores the SwiGLU runs inside fc2's grouped input cast
// (TEGroupedLinear::forward_swiglu): its bf16 output is never stored.
// --recompute-modules moe_act (refused with delayed scaling, as by Megatron): the activation's
// output (fc2's input) is discarded once fc2 has run and recomputed from fc1's output in backward
// (models/recompute/output_discarding_recompute.h).
#pragma once
#include <torch/torch.h>

#include <string>
#include <vector>

#include "core/config/model_config.h"
#include "models/linear/grouped_linear.h"
#include "models/module_factory.h"

namespace fp8tron {
class ActivationOffloader;

class GroupedMlpImpl : public torch::nn::Module {
 public:
  // `factory`: its tensor-parallel context is the expert tensor-parallel group.
  GroupedMlpImpl(const ModelConfig& m, const std::string& prefix, int64_t num_local_experts, int64_t expert_offset,
                 const ModuleFactory& factory, bool use_fp8);
  // x [rows, H] grouped by local expert, counts per local expert (host). Returns [rows, H]:
  // each row its expert's output, partial sums over the expert tensor-parallel group.
  // packed_x (--moe-dispatch-fp8): x's rows as the dispatch delivered them, FP8 codes and scales
  // (fp8/packed_rows.h) that fc1 uses as they are; x holds their values.
  torch::Tensor forward(const torch::Tensor& x, const std::vector<int64_t>& counts, const torch::Tensor& packed_x = {});
  // Whether fc1 takes its rows quantized before the dispatch (FP8 experts of a per-block recipe).
  bool takes_packed_input() const { return linear_fc1->takes_packed_input(); }

  TEGroupedLinear linear_fc1{nullptr}, linear_fc2{nullptr};

 private:
  torch::Tensor activation(const torch::Tensor& h) const;
  torch::Tensor activation_and_fc2(const torch::Tensor& h, const std::vector<int64_t>& counts);
  bool swiglu_;
  bool recompute_activation_;
  // --offload-modules expert_fc1 / moe_act (models/recompute/activation_offload.h); null: kept.
  ActivationOffloader* offload_fc1_ = nullptr;
  ActivationOffloader* offload_act_ = nullptr;
};
TORCH_MODULE(GroupedMlp);

}  // namespace fp8tron
