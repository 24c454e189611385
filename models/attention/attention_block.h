// One block of attention -- some queries against some keys -- as the fused attention kernels
// compute it, with the softmax's log-sum-exp (LSE) returned, so that blocks over different keys
// can be merged exactly afterwards (context-parallel ring attention, all-gather attention):
//
//   out = sum_b exp(lse_b - lse) out_b,  lse = log sum_b exp(lse_b)
//
// and the backward pass of each block computed from the *merged* output and LSE (the softmax
// normalisation of the whole row), which gives every block its exact share of the gradient.
//
// Kernels: on GPUs ATen's flash, memory-efficient and cuDNN attention (each returns the LSE and
// takes it back in backward; dropout through their Philox seed and offset); on the CPU, and where
// no fused kernel fits, a math path with the same semantics (fp32 softmax, a stored dropout mask).
#pragma once
#include <torch/torch.h>

#include <vector>

namespace fp8tron {

enum class AttentionKernel { Math, Flash, Efficient, Cudnn };
const char* attention_kernel_name(AttentionKernel k);

struct AttentionBlockOptions {
  bool causal = false;  // a block on the diagonal (as many keys as queries): query i sees keys <= i
  double dropout = 0;   // on the attention probabilities
  double scale = 0;     // softmax scale
  AttentionKernel kernel = AttentionKernel::Math;
};

// What a block's backward needs from its forward besides the inputs and the merged output: the
// kernel's bookkeeping (Philox seed and offset for dropout, LSE layout, output strides), or the
// math path's dropout mask.
struct AttentionBlockState {
  torch::Tensor philox_seed, philox_offset, cum_seq_q, cum_seq_k, dropout_mask;
  int64_t max_q = 0, max_k = 0;
  std::vector<int64_t> lse_shape, out_strides;
};

struct AttentionBlockResult {
  torch::Tensor out;  // [b, h, sq, d], the input dtype
  torch::Tensor lse;  // [b, h, sq] fp32, natural logarithm
  AttentionBlockState state;
};

struct AttentionBlockGrads {
  torch::Tensor dq, dk, dv;
};

// q [b, h, sq, d]; k, v [b, hk, sk, d] with h a multiple of hk (grouped keys and values: query
// head i uses head i / (h / hk)).
AttentionBlockResult attention_block_forward(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                             const AttentionBlockOptions& options);
// The block's gradients, given dout, out and lse of its query rows *after* merging every block of
// those rows (out in the input dtype, lse fp32 [b, h, sq]). dq [b, h, sq, d], dk/dv [b, hk, sk, d],
// in the inputs' dtypes.
AttentionBlockGrads attention_block_backward(const torch::Tensor& dout, const torch::Tensor& q, const torch::Tensor& k,
                                             const torch::Tensor& v, const torch::Tensor& out, const torch::Tensor& lse,
                                             const AttentionBlockState& state, const AttentionBlockOptions& options);

// Merges a block's (out, lse) into running ones, in place: out_acc fp32 [b, h, sq, d] and lse_acc
// fp32 [b, h, sq] (-inf where nothing is merged yet); views of larger accumulators are fine.
void merge_attention_block(torch::Tensor& out_acc, torch::Tensor& lse_acc, const torch::Tensor& out, const torch::Tensor& lse);

// The kernel for blocks of these shapes: ATen's fused-attention choice on GPUs (cuDNN first, see
// configure_attention_backends), the math path on the CPU.
AttentionKernel choose_attention_kernel(const torch::Tensor& q, const torch::Tensor& k, double dropout, bool causal);

}  // namespace fp8tron
