// Transformer-Engine-named building blocks, tensor- and sequence-parallel: TELayerNorm,
// TEColumnParallelLinear, TELayerNormColumnParallelLinear (norm fused in front of the GEMM, as
// TE), TERowParallelLinear. Parameter names follow TE (layer_norm_weight, weight, bias) so state
// dicts read like Megatron-Core's. Activations are [sequence, batch, hidden]; with sequence
// parallelism, tensors outside the column/row pair are split along the sequence.
// With an FP8 engine in the ModuleFactory the linears run their GEMMs in FP8 (fp8/fp8_linear.h);
// the sequence-parallel all-gather stays bf16 and the GEMM input is quantized after it. With the
// tensor-parallel overlap on (TensorParallelContext::overlap), the qkv/proj/fc1/fc2 linears (and
// under MC2 the output layer) run as parallel/overlap's communicating op instead, which gathers FP8
// inputs already quantized (models/linear_kernels_*.h are its GEMMs).
#pragma once
#include <torch/torch.h>

#include <optional>

#include "models/module_factory.h"
#include "models/norm/norm.h"
#include "models/norm/residual_norm.h"
#include "models/attention/rotary.h"
#include "core/config/model_config.h"
#include "fp8/quantize.h"
#include "parallel/overlap/tp_linear.h"

namespace fp8tron {

// The global layer number in a module's name ("decoder.layers.12.mlp.linear_fc1" -> 12); -1
// outside the transformer layers. FP8 sites use it for --first-last-layers-bf16.
int64_t layer_number(const std::string& name);
// The entry of a per-layer list (--cp-comm-type) a module's attention takes: the decoder layer's
// number, and for the multi-token-prediction layer of depth k ("mtp.layers.k.") k, as Megatron
// numbers its MTP layers 1, 2, ... like the first decoder layers. 0 elsewhere.
int64_t per_layer_index(const std::string& name);

struct LinearOptions {
  int64_t in_features = 0;   // global sizes
  int64_t out_features = 0;
  bool bias = true;
  double init_std = 0.02;
  int interleave = 1;        // column-parallel: output blocks split separately (SwiGLU's gate|up)
  std::string init_name;     // full parameter-name prefix, seeds the initialisation
  bool external_weight = false;  // the weight is passed to forward_with (tied output layer)
  bool fp8 = true;               // may run in FP8 (the output layer stays bf16, as in Megatron)
};

namespace fp8 {
struct Fp8Site;
}

// TELayerNorm. `partial_grads`: the input is a sequence shard (SP) or a head shard (QK norm), so
// each tensor-parallel rank holds a partial gradient that must be summed over the group.
class TELayerNormImpl : public ShardedModule {
 public:
  TELayerNormImpl(const NormOptions& options, bool partial_grads, const ModuleFactory& factory);
  torch::Tensor forward(const torch::Tensor& x);
  // The norm of the stream's sum with the pending add fused into it (models/norm/residual_norm.h).
  ResidualNormOutput forward_residual(const ResidualStream& in);
  NormOptions options;
  torch::Tensor weight, bias;
};
TORCH_MODULE(TELayerNorm);

// y = x W^T (+ b) with W split by output rows over tensor-parallel ranks; the input enters the
// parallel region (copy, or all-gather of sequence shards with SP).
class TEColumnParallelLinearImpl : public ShardedModule {
 public:
  TEColumnParallelLinearImpl(const LinearOptions& options, const ModuleFactory& factory);
  torch::Tensor forward(const torch::Tensor& x);
  // Shares an existing weight (the tied output layer uses the word embedding).
  torch::Tensor forward_with(const torch::Tensor& x, const torch::Tensor& weight);
  LinearOptions options;
  TensorParallelContext tp;
  torch::Tensor weight, bias;
  std::shared_ptr<fp8::Fp8Site> fp8_site;  // null: bf16 GEMMs
  bool overlapped = false;                 // runs as the communicating op with this plan
  overlap::TpLinearPlan overlap_plan;
};
TORCH_MODULE(TEColumnParallelLinear);

class TELayerNormColumnParallelLinearImpl : public ShardedModule {
 public:
  TELayerNormColumnParallelLinearImpl(const NormOptions& norm, const LinearOptions& linear, const ModuleFactory& factory);
  torch::Tensor forward(const torch::Tensor& x);
  // forward() of the stream's sum, returned too. The pending add is fused into the norm
  // (models/norm/residual_norm.h), and on one bf16 rank the norm into the GEMM's op
  // (models/linear/norm_linear.h); under the overlapped op, which fuses the norm into its FP8 cast, the
  // sum is formed first and forward() runs on it.
  ResidualOutput forward_residual(const ResidualStream& in);
  // The bf16 GEMM's input: x normed, entered into the tensor-parallel region (all-gathered under
  // SP). Without FP8 or the overlap, forward(x) is this rank's linear of it; the dense MLP's fused
  // GeLU path (TERowParallelLinear::forward_fused_gelu_mlp) runs fc1 on it itself.
  torch::Tensor gemm_input(const torch::Tensor& x);
  // gemm_input() of the stream's sum, with the sum: the pending add fused into the norm (the bf16 path
  // without FP8 or the overlap, where the fused GeLU MLP runs).
  ResidualOutput gemm_input_residual(const ResidualStream& in);
  // The norm as a prologue of this rank's GEMM in one op (models/linear/norm_linear.h, the fused GeLU
  // MLP), which keeps no normed input for the backward: on one tensor-parallel rank without FP8 or
  // the overlap, where the norm's kernels take the stream. Otherwise nullopt.
  std::optional<NormPrologue> fusable_norm(const ResidualStream& in) const;
  NormOptions norm_options;
  LinearOptions linear_options;
  TensorParallelContext tp;
  torch::Tensor layer_norm_weight, layer_norm_bias, weight, bias;
  std::shared_ptr<fp8::Fp8Site> fp8_site;
  bool overlapped = false;
  overlap::TpLinearPlan overlap_plan;
};
TORCH_MODULE(TELayerNormColumnParallelLinear);

// A linear's output, and its bias where the linear left it to the caller (Megatron's
// skip_bias_add): out + bias is the linear's result. bias undefined: none pending.
struct DeferredBiasOutput {
  torch::Tensor out, bias;
};

// y = x W^T + b with W split by input columns; partial outputs are summed over the group
// (all-reduce, or reduce-scatter to sequence shards with SP) before the bias.
//
// The forward_* calls that take `defer_bias` leave the bias to the caller where it asks and the
// linear is a bf16/fp32 one on one GPU (no FP8, no tensor parallelism): the output projections of a
// layer's branches, whose bias the next norm adds in its kernel (ResidualStream::branch_bias) and
// whose backward pass sums the bias's gradient, so the wgrad GEMM runs without cuBLASLt's BGRADB
// epilogue (a second kernel reading dY on Hopper). Elsewhere the bias is added here as before.
class TERowParallelLinearImpl : public ShardedModule {
 public:
  TERowParallelLinearImpl(const LinearOptions& options, const ModuleFactory& factory);
  torch::Tensor forward(const torch::Tensor& x);
  DeferredBiasOutput forward_deferring_bias(const torch::Tensor& x, bool defer_bias);
  // forward(gelu_tanh(x)); with FP8 the GeLU is fused into the cast of the GEMM input.
  DeferredBiasOutput forward_gelu(const torch::Tensor& x, bool defer_bias = false);
  // forward(gelu_tanh(x W1^T + b1)) of the dense bf16 MLP with fc1 (weight W1, bias b1: this
  // rank's) run here too, as one op that saves fc1's pre-activation only (models/mlp/fused_gelu_mlp.h): x
  // is fc1's GEMM input (TELayerNormColumnParallelLinear::gemm_input). Only where
  // fused_gelu_mlp_applies.
  DeferredBiasOutput forward_fused_gelu_mlp(const torch::Tensor& x, const torch::Tensor& fc1_weight,
                                            const torch::Tensor& fc1_bias, bool defer_bias);
  // Whether it can run: this linear bf16 (no FP8 site) and not overlapped, and the tensors fit
  // (fused_gelu_mlp_blocker). x: fc1's GEMM input, or any tensor of its dtype, device and width.
  bool fused_gelu_mlp_applies(const torch::Tensor& x, const torch::Tensor& fc1_weight,
                              const torch::Tensor& fc1_bias) const;
  // forward_fused_gelu_mlp of fc1's norm of the stream, the norm run in the same op
  // (fused_norm_gelu_mlp): fc1_norm from TELayerNormColumnParallelLinear::fusable_norm.
  ResidualOutput forward_fused_norm_gelu_mlp(const ResidualStream& in, const NormPrologue& fc1_norm,
                                             const torch::Tensor& fc1_weight, const torch::Tensor& fc1_bias,
                                             bool defer_bias);
  // forward(silu(gate) * up) of x = [gate | up]; with FP8 fused into the cast of the GEMM input,
  // else one kernel each way on a GPU (models/mlp/fused_swiglu.h).
  DeferredBiasOutput forward_swiglu(const torch::Tensor& x, bool defer_bias = false);
  LinearOptions options;
  TensorParallelContext tp;
  torch::Tensor weight, bias;
  std::shared_ptr<fp8::Fp8Site> fp8_site;
  bool overlapped = false;
  overlap::TpLinearPlan overlap_plan;

 private:
  // The communicating op: partial outputs reduce-scattered as they are computed, then the bias.
  torch::Tensor forward_overlapped(const torch::Tensor& x, fp8::Prologue prologue);
  // Partial outputs summed over the group (all-reduce, or reduce-scatter under SP), then the bias
  // unless deferred.
  torch::Tensor reduce_and_add_bias(const torch::Tensor& partial, bool deferred = false);
  // The bias the GEMM adds itself (without tensor parallelism, unless deferred).
  torch::Tensor own_bias(bool deferred = false) const;
  // Whether a call on x asking for defer_bias leaves the bias to its caller.
  bool defers_bias(const torch::Tensor& x, bool defer_bias) const;
  DeferredBiasOutput output(const torch::Tensor& partial, bool deferred);
};
TORCH_MODULE(TERowParallelLinear);

// The weights and biases of the bf16 linears under `model` whose gradients only their own GEMMs
// produce: no FP8 site, not the overlapped op, not a shared weight, and the bias in the GEMM's
// epilogue (not added after a tensor-parallel reduction). Where gradient-accumulation fusion
// applies, a step's first wgrad GEMM may write their main gradients (models/linear/main_grad_first_write.h).
std::vector<torch::Tensor> gemm_written_params(const torch::nn::Module& model);

}  // namespace fp8tron
