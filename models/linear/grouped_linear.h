// TEGroupedLinear: Transformer Engine's GroupedLinear for mixture-of-experts layers (Megatron-Core's
// TEGroupedLinear / TEColumnParallelGroupedLinear / TERowParallelGroupedLinear). num_gemms experts,
// each with its own weight<i> [out, in] (and bias<i> [out]), TE's parameter names. The tokens
// arrive permuted so that each expert's are contiguous: forward(x [tokens, in], m_splits) runs rows
// [m_splits[0] + ... + m_splits[i-1], + m_splits[i]) through expert i and returns [tokens, out].
//
// Tensor parallelism is Megatron's explicit expert communication: this module communicates
// nothing, the token dispatcher moves tokens around it.
//   column  weight<i> split by output rows ([out / tp, in], `interleave` blocks split separately
//           for SwiGLU's gate|up), bias<i> likewise; outputs are this rank's output features.
//   row     weight<i> split by input columns ([out, in / tp]). Outputs are PARTIAL SUMS, returned
//           unreduced: Megatron's grouped MLP reduces after the token combine, once for all
//           experts. Their sum over the group is the layer's output: tensor-parallel rank 0 adds
//           the biases, the other ranks do not (so the bias gradient lives on rank 0 and is summed
//           over the group: ParamInfo::reduce_grad_over_tp, where TERowParallelLinear needs that
//           only under sequence parallelism).
//
// The experts run as one grouped GEMM (fp8/fp8_grouped_linear.h): one autograd node, every
// expert's GEMMs of a pass in one launch sequence over a few CUDA streams, outputs written in place.
// FP8: with an engine in the ModuleFactory each expert is one FP8 site ("<init_name>.weight<g>",
// its own scaling state), every recipe (delayed, tensorwise, blockwise on FP8 tensor cores; MXFP8
// and HiF8 emulated as in dense layers), the input and output gradient of all experts quantized in
// one pass. Token counts that are not a multiple of 16 (32 for MXFP8) are padded inside, as
// Megatron/TE's Fp8Padding does: never refused, never silently bf16. Expert GEMMs stay bf16 when
// there is no engine, with use_fp8 = false (--no-use-gmm-fp8), or when the engine keeps the layer
// in bf16 (--first-last-layers-bf16, --fp8-min-features).
//
// Experts that receive no tokens: no GEMM runs for them, but their weight (and bias) still get a
// gradient, zero, in every backward. The autograd graph therefore does not depend on the routing,
// so data-parallel ranks, which route differently, complete their gradient buckets in the same
// order (parallel/grad_buckets.h).
#pragma once
#include <torch/torch.h>

#include <memory>
#include <string>
#include <vector>

#include "models/module_factory.h"

namespace fp8tron {
namespace fp8 {
struct Fp8Site;
enum class Prologue : uint8_t;
}

enum class GroupedParallelMode : uint8_t { kColumn, kRow };

struct GroupedLinearOptions {
  int64_t in_features = 0;   // one expert's global sizes
  int64_t out_features = 0;
  int64_t num_gemms = 1;     // experts held by this module
  // The global index of this module's first expert (expert-parallel rank x num_gemms). Experts are
  // registered, seeded and named by their global index g = expert_offset + i (weight<g>, FP8 site
  // "<init_name>.weight<g>"), so initialisation and checkpoints do not depend on the layout.
  int64_t expert_offset = 0;
  bool is_expert = false;    // routed experts (ParamInfo::expert): reduced over the expert data-parallel group
  bool bias = true;
  double init_std = 0.02;
  std::string init_name;     // module name: weight<g> is seeded from "<init_name>.weight<g>"
  GroupedParallelMode parallel_mode = GroupedParallelMode::kColumn;
  int interleave = 1;        // column mode: the output stacks this many blocks, each split (SwiGLU)
  bool use_fp8 = true;       // false: bf16 expert GEMMs even with an FP8 engine (--no-use-gmm-fp8)
};

class TEGroupedLinearImpl : public ShardedModule {
 public:
  TEGroupedLinearImpl(const GroupedLinearOptions& options, const ModuleFactory& factory);
  // x [tokens, local in features]; m_splits: tokens per expert (num_gemms counts, >= 0, summing to
  // tokens; UserError otherwise), host values (no device synchronisation). Returns [tokens, local
  // out features] (row mode: partial sums).
  // packed_x (--moe-dispatch-fp8, where takes_packed_input()): x's rows as they arrived, already
  // quantized (fp8/packed_rows.h); the fprop GEMMs use those codes and scales, x holds their values.
  torch::Tensor forward(const torch::Tensor& x, const std::vector<int64_t>& m_splits, const torch::Tensor& packed_x = {});
  // Whether forward takes packed_x: FP8 experts (not kept in bf16) of a per-block recipe.
  bool takes_packed_input() const;
  // forward(silu(gate) * up) of h = [gate | up] ([tokens, 2 x local in features], a SwiGLU fc1's
  // output), with the SwiGLU inside the FP8 input cast: call it where fuses_swiglu() holds (FP8
  // experts, delayed scaling on FP8 tensor cores). The activation is never stored in bf16.
  torch::Tensor forward_swiglu(const torch::Tensor& h, const std::vector<int64_t>& m_splits);
  bool fuses_swiglu() const;

  GroupedLinearOptions options;
  TensorParallelContext tp;
  std::vector<torch::Tensor> weights, biases;            // local expert i = weight<expert_offset + i>, bias<...>
  std::vector<std::shared_ptr<fp8::Fp8Site>> fp8_sites;  // one per expert; empty: bf16 GEMMs
  // Gradient-accumulation fusion: the experts' wgrads into their fp32 main gradients (the model's
  // setting, models/linear/main_grads.h).
  bool main_grad_fusion = true;
  // Set by the MoE layer when its dispatcher delivers this (fc1) module's input as FP8 codes
  // (--moe-dispatch-fp8); only what --print-model-plan says.
  bool input_dispatched_fp8 = false;
  // The experts' GEMMs (--print-model-plan).
  std::string describe_plan() const;

 private:
  MainGradsPtr main_grads_;  // --delay-wgrad-compute: its queue holds the experts' weight gradients
  void check_splits(const torch::Tensor& x, const std::vector<int64_t>& m_splits) const;
  torch::Tensor run(const torch::Tensor& x, const std::vector<int64_t>& m_splits, fp8::Prologue prologue,
                    const torch::Tensor& packed_x = {});
  torch::Tensor gemm_bias(size_t expert) const;  // the bias this rank adds (undefined: none)
  std::vector<fp8::Fp8Site*> gemm_sites() const;  // empty: bf16 GEMMs
};
TORCH_MODULE(TEGroupedLinear);

}  // namespace fp8tron
