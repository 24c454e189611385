// The residual add fused with the norm that reads its result. A pre-norm transformer
// layer computes h = x + branch and then norm(h) for the next sub-layer, h staying the residual
// stream; in backward the stream's gradient and the norm's input gradient meet at h and are
// summed. residual_add_norm computes {sum, normed} = {residual + branch, norm(residual + branch)}:
//   forward:  one kernel reads residual and branch and writes the sum (rounded to the activation
//             dtype exactly as torch's add rounds it) and the normed output, with fp32 row
//             statistics; the sum, gamma and the statistics (mean, rstd; fp32) are saved;
//   backward: one kernel computes d_residual = d_branch = d_sum + the norm's input gradient of
//             d_normed in fp32 with one rounding (either gradient may be absent: zero); gamma's
//             and beta's gradients in fp32 from per-block partial sums reduced in a fixed order,
//             bitwise the same on every run (models/norm/residual_norm_kernels.h).
// Against the unfused chain this saves the add kernels (one each way) and a pass over the sum in
// each direction. The branch may come with its own pending bias (the output projection's, see
// ResidualStream): sum = residual + (branch + bias), each add rounded as torch rounds it, and the
// backward pass also sums the bias's gradient (the branch's, over tokens) in fp32. An undefined branch makes it the norm of residual alone (sum is residual).
// Zero-centred gamma (--apply-layernorm-1p) adds 1 to the weight in fp32 (the unfused chain adds it
// in the weight's dtype).
//
// The kernels run for CUDA tensors of fp32, bf16 or fp16 with residual, branch and the norm's
// parameters of one dtype, the same shape, and a hidden size up to 8192. Anywhere else (the CPU,
// wider rows, mixed dtypes) the op is the unfused chain through torch's ops: those semantics are
// the op's, and a CPU model computes bitwise what it did before the fusion.
#pragma once
#include <torch/torch.h>

#include "fp8/norm_backward.h"
#include "models/linear/linear_grads.h"
#include "models/norm/norm.h"

namespace fp8tron {

struct ResidualNormOutput {
  torch::Tensor sum;     // residual + branch: the residual stream from here on
  torch::Tensor normed;  // norm(sum): the next sub-layer's input
};

// branch_bias (undefined: none) is the branch's pending bias: sum = residual + (branch + branch_bias).
// `main_grads`: the model's (models/linear/main_grads.h): gamma's, beta's and the branch bias's
// gradients go into their fp32 main gradients as it says (null: to autograd).
ResidualNormOutput residual_add_norm(const torch::Tensor& residual, const torch::Tensor& branch, const NormOptions& options,
                                     const torch::Tensor& weight, const torch::Tensor& bias,
                                     const torch::Tensor& branch_bias, const MainGradsPtr& main_grads);

// The norm of x alone, as every module runs it: residual_add_norm's kernel on GPUs, so that a norm
// whose residual add ran apart (at a recomputed unit's boundary, inside a recomputed MLP) gives
// the bits the fused add + norm gives; torch_norm elsewhere.
torch::Tensor apply_norm(const torch::Tensor& x, const NormOptions& options, const torch::Tensor& weight,
                         const torch::Tensor& bias, const MainGradsPtr& main_grads);

// The unfused chain (residual + branch, then torch_norm): the CPU path and the GPU reference.
ResidualNormOutput unfused_residual_add_norm(const torch::Tensor& residual, const torch::Tensor& branch,
                                             const NormOptions& options, const torch::Tensor& weight,
                                             const torch::Tensor& bias, const torch::Tensor& branch_bias,
                                             const MainGradsPtr& main_grads);

// The same kernels as the first stage of another op's autograd function: the norm + linear
// (models/linear/norm_linear.h) and the norm + GeLU MLP (models/mlp/fused_gelu_mlp.h). Such an op keeps what
// the norm's backward reads (the sum and the fp32 statistics; gamma and beta are parameters) but
// not the normed output its GEMM read: the norm's backward pass writes that again, bit for bit,
// just before the GEMM's weight gradient needs it. One [tokens, hidden] activation less kept from
// forward to backward per normed GEMM, for one store in a pass that loads the row anyway.
struct NormPrologue {
  NormOptions options;
  torch::Tensor weight, bias;  // gamma, and LayerNorm's beta (may be undefined)
};
struct NormSaved {
  torch::Tensor sum, mean, rstd;  // mean undefined for RMSNorm
};
struct NormPrologueForward {
  torch::Tensor sum, normed;  // sum is residual itself without a branch
  NormSaved saved;
};
// The gradients the norm's backward pass sums over the rows besides its input's, and where they go.
// With into_main_grads and main_grads fusing (models/linear/main_grads.h), gamma's and beta's go
// into the parameters' fp32 main gradients where they have them (is_main_grad: added
// to, or written in the step's first write, as the wgrad GEMMs do); else, in the parameters'
// dtype, to autograd. That saves autograd's add of a rounded gradient into the fp32 buffer (one
// small kernel per norm parameter), and the gradient keeps its fp32 sum.
struct NormGradRequest {
  bool gamma = false, beta = false;  // autograd wants them (beta: LayerNorm with a shift)
  bool into_main_grads = true;
  MainGradsPtr main_grads;           // the model's; null: everything to autograd
  BiasGradTarget branch_bias;        // the forward's pending branch bias's (bias_grad_target)
};
struct NormPrologueBackward {
  torch::Tensor d_in;               // d_sum + the norm's input gradient: residual's and branch's
  torch::Tensor d_weight, d_bias;   // what autograd gets: undefined unless requested, or where they
                                    // went into main gradients
  torch::Tensor normed;             // the forward's output again, if asked for
};

// The options an autograd function rebuilds from its saved flags (the epsilon only matters forward).
NormOptions norm_options_of(bool rms, double epsilon, bool zero_centered_gamma, int64_t size);

// Whether the kernels take these tensors (the conditions of residual_add_norm's fused path).
// branch_bias, where defined, needs a branch.
bool norm_prologue_applies(const torch::Tensor& residual, const torch::Tensor& branch, const NormPrologue& norm,
                           const torch::Tensor& branch_bias = {});
// Call only where norm_prologue_applies. branch may be undefined (the norm of residual alone);
// branch_bias too (the branch has no pending bias).
NormPrologueForward norm_prologue_forward(const torch::Tensor& residual, const torch::Tensor& branch,
                                          const NormPrologue& norm, const torch::Tensor& branch_bias = {});
// d_sum may be undefined (zero). The gradients autograd gets have the activations' dtype. With
// request.branch_bias the same pass sums the branch's gradient over tokens into it: the bias's
// gradient, in fp32.
NormPrologueBackward norm_prologue_backward(const NormPrologue& norm, const NormSaved& saved, const torch::Tensor& d_normed,
                                            const torch::Tensor& d_sum, const NormGradRequest& request,
                                            bool rewrite_normed);

// The backward of the norm an FP8 linear fuses into its input cast (fp8/norm_backward.h), through
// this kernel: given to the FP8 engine by the modules that own such a norm. torch's where the
// kernel does not take the tensors.
fp8::NormBackwardGrads fp8_norm_backward(const fp8::NormBackwardInputs& in);

// The residual stream where a norm reads it: the hidden states are residual + branch, the branch
// (the last sub-layer's output, after its dropout) not added yet so that the norm can add it
// itself. An undefined branch: residual is the hidden states. branch_bias is the branch's own bias
// when its linear left it to the norm (Megatron's skip_bias_add, the bias-dropout-add fusion):
// the hidden states are then residual + (branch + branch_bias), and the norm's backward pass sums
// the bias's gradient (no bias-gradient epilogue on the linear's wgrad GEMM). Only without
// dropout on the branch (the bias goes in before a dropout).
struct ResidualStream {
  torch::Tensor residual, branch, branch_bias;
  // residual + (branch + branch_bias) through torch's ops, where no norm folds the add. On a GPU
  // the bias's gradient goes where the norms' kernels put it (bias_grad_target of `main_grads`).
  torch::Tensor sum(const MainGradsPtr& main_grads) const;
};

// A sub-layer run on a residual stream: the stream's sum (the residual of the sub-layer's own add)
// and the sub-layer's output, whose bias out_bias (undefined: none) is still to be added where
// the sub-layer was asked to leave it (out + out_bias is the output).
struct ResidualOutput {
  torch::Tensor sum, out, out_bias;
};

}  // namespace fp8tron
