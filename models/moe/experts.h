// The routed experts of an MoE layer (Megatron-Core's TEGroupedMLP): linear_fc1 and linear_fc2
// as TEGroupedLinear over this rank's local experts, column- and row-parallel over the expert
// tensor-parallel group, with the dense MLP's activation (SwiGLU or GeLU) in between. Parameters
// decoder.layers.N.mlp.experts.linear_fc{1,2}.weight<g> with g the GLOBAL expert index, drawn
// from (seed, name): the same experts in every expert-parallel layout.
//
// FP8: FP8 GEMMs need each expert's token count to be a multiple of 16 (32 for MXFP8). As
// Megatron's TEGroupedMLP (Fp8Padding), the experts pad each expert's rows with zero rows to that
// multiple, run the grouped GEMMs on the padded layout and drop the padding rows from the output:
// zero rows change neither the outputs nor the weight gradients (with expert biases, the padding
// rows' fc1 bias does reach fc2's input amax). Counts that are already aligned
// (--moe-router-padding-for-quantization) pass through unchanged.
#pragma once
#include <torch/torch.h>

#include <string>
#include <vector>

#include "core/config/model_config.h"
#include "models/grouped_linear.h"
#include "models/module_factory.h"

namespace fp8tron {

class GroupedMlpImpl : public torch::nn::Module {
 public:
  // `factory`: its tensor-parallel context is the expert tensor-parallel group.
  GroupedMlpImpl(const ModelConfig& m, const std::string& prefix, int64_t num_local_experts, int64_t expert_offset,
                 const ModuleFactory& factory, bool use_fp8);
  // x [rows, H] grouped by local expert, counts per local expert (host). Returns [rows, H]:
  // each row its expert's output, partial sums over the expert tensor-parallel group.
  torch::Tensor forward(const torch::Tensor& x, const std::vector<int64_t>& counts);

  TEGroupedLinear linear_fc1{nullptr}, linear_fc2{nullptr};

 private:
  int64_t fp8_alignment() const;  // 0 when the expert GEMMs are not FP8
  bool swiglu_;
  int64_t alignment_ = 0;
};
TORCH_MODULE(GroupedMlp);

}  // namespace fp8tron
