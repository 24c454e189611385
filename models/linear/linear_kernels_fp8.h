// The GEMM functor of an overlapped tensor-parallel linear (parallel/overlap/linear_kernels.h) in
// FP8, over fp8/linear_ops.h. What travels and why the result equals the non-overlapped FP8 linear
// (fp8_linear.h, which gathers in bf16 and quantizes the gathered tensor):
//   delayed     row-wise codes, quantized before the all-gather with the site's scale (equal on
//               every rank); each rank records its shard's amax and end_step's MAX-reduction over
//               the tensor-parallel group makes it the gathered tensor's amax
//   tensorwise  row-wise codes; the shard's amax is MAX-reduced over the group before the scale is
//               taken (one 4-byte all-reduce), so scale and codes equal the gathered tensor's
//   blockwise, MXFP8   row-wise codes and their block scales (blocks lie within a row); the
//               transposed copies wgrad needs are quantized from the gathered high-precision rows
//               (blocks along tokens cross the shards), which the backward gathers instead
// The transposed copy of tensor-scaled gathered codes is their byte transpose (the same codes). The
// GEMMs run on the same codes, scales and dequantized values as fp8_linear's, in row blocks or
// column splits (docs/overlap.md: which of those are bitwise on the CPU).
#pragma once
#include <torch/torch.h>

#include <memory>

#include "fp8/linear_ops.h"
#include "parallel/communicator.h"
#include "parallel/overlap/linear_kernels.h"
#include "parallel/overlap/tp_linear.h"

namespace fp8tron {

// Whether the norm of a TELayerNormColumnParallelLinear can be fused into the cast of its input's
// shard (FP8 tensor cores, delayed scaling, training, bf16 tensors): the fused norm+cast of
// fp8_norm_linear, now under tensor parallelism, before the all-gather.
bool fused_norm_cast_available(const fp8::Fp8Site& site, const torch::Tensor& x, const torch::Tensor& gamma,
                               const torch::Tensor& beta);

class Fp8LinearKernels : public overlap::LinearKernels {
 public:
  // weight [out, in] and bias [out] (or undefined) are the module's parameters; `tp` reduces the
  // tensorwise amaxes of gathered tensors; `prologue` is fused into the cast of a row-parallel
  // input (GeLU or SwiGLU of an MLP's fc2).
  Fp8LinearKernels(torch::Tensor weight, torch::Tensor bias, fp8::Fp8Site& site, Communicator& tp,
                   const overlap::TpLinearPlan& plan, fp8::Prologue prologue);
  // The op's input is the norm's input: the norm runs fused into the cast (see above); the norm's
  // gamma (and beta) are the op's extra inputs, their gradients returned by input_grads.
  void fuse_norm(bool rms, const torch::Tensor& gamma, const torch::Tensor& beta, double eps, bool zero_centered_gamma);

  overlap::Operand prepare_input(const torch::Tensor& x, bool to_gather) override;
  overlap::Operand slice_rows(const overlap::Operand& op, int64_t begin, int64_t count) override;
  overlap::Operand adopt(const overlap::Operand& local, std::vector<torch::Tensor> wire) override;
  void fprop(const overlap::Operand& x, overlap::Range rows, overlap::Range cols, torch::Tensor& out) override;
  overlap::Operand saved_input(const overlap::Operand& x, bool gathered_in_backward) override;
  overlap::Operand prepare_grad_output(const torch::Tensor& dy, bool to_gather) override;
  void dgrad(const overlap::Operand& dy, overlap::Range rows, overlap::Range cols, torch::Tensor& out) override;
  overlap::Operand join(const std::vector<overlap::Operand>& blocks, bool grad_output) override;
  overlap::WeightGrads wgrad(const overlap::Operand& dy, const overlap::Operand& x, bool need_dw, bool need_db) override;
  std::vector<torch::Tensor> input_grads(torch::Tensor dx) override;
  overlap::Operand quantize_partial(const torch::Tensor& rows) override;
  torch::Tensor dequantize_partial(const overlap::Operand& block) override;

 private:
  struct Block;
  struct Norm;
  static std::shared_ptr<Block> block_of(const overlap::Operand& op);
  bool tensor_scaled(fp8::TensorRole role) const;
  // The SM budget of a native GEMM overlapped as `how` says (TE's set_sm_margin / num_sm).
  int sm_budget(const GemmOverlap& how) const;
  const fp8::Quantized& weight_q();
  overlap::Operand operand(std::shared_ptr<Block> block, std::vector<torch::Tensor> wire) const;
  std::shared_ptr<fp8::Quantized> quantize_gathered_rows(fp8::TensorRole role, const torch::Tensor& rows, bool record_amax);

  fp8::Fp8Site& site_;
  fp8::Fp8Engine& engine_;
  Communicator& tp_;
  overlap::TpLinearPlan plan_;
  fp8::Prologue prologue_;
  torch::Tensor weight_param_, weight_, bias_;
  bool track_ = false;   // a training step: keep what backward needs
  bool record_ = false;  // ... and record amaxes (not in a recomputed forward pass)
  std::shared_ptr<fp8::Quantized> weight_q_;
  fp8::AmaxReducer reduce_over_tp_;
  // backward state
  torch::Tensor activation_input_;  // GeLU / SwiGLU input of a row-parallel fc2
  torch::Tensor fused_db_;          // bias gradient from the gradient cast (native path)
  std::shared_ptr<Norm> norm_;
  torch::ScalarType input_dtype_ = torch::kFloat32;
};

}  // namespace fp8tron
