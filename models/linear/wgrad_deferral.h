// Megatron's --defer-embedding-wgrad-compute for the output layer of the last pipeline stage: the
// weight-gradient GEMMs (dW = dY^T X) of the step's first --wgrad-deferral-limit micro-batches (0:
// all) wait until its pipeline schedule has run. The stage then hands each input gradient to the
// previous stage as soon as it has it and computes the vocabulary-wide weight gradients while the
// other stages finish their backward passes (the pipeline flush), instead of in between.
//
// The weight enters the deferred linear detached, so no micro-batch's autograd pass touches it:
// its gradient is added only by this object (in the backward pass for the micro-batches past the
// limit, in drain() for the rest), into its fp32 main gradient or `.grad`. No gradient-ready hook
// fires for it either, so an overlapped data-parallel reduction takes its bucket after drain()
// (GradBuckets::finish launches the buckets that never completed).
#pragma once
#include <torch/torch.h>

#include <memory>
#include <utility>
#include <vector>

#include "models/linear/main_grads.h"

namespace fp8tron {

class WgradDeferral {
 public:
  WgradDeferral(int64_t limit, MainGradsPtr main_grads) : limit_(limit), main_grads_(std::move(main_grads)) {}

  // Whether the next training forward's weight gradient waits for drain(): the first `limit`
  // forwards since the last drain (all of them with limit 0).
  bool defer_next() { return limit_ == 0 || calls_++ < limit_; }
  // From the backward pass: x [tokens, in] and dy [tokens, out] of one deferred GEMM.
  void hold(torch::Tensor x, torch::Tensor dy) { held_.emplace_back(std::move(x), std::move(dy)); }
  // Adds dW = dy^T x of one GEMM into `weight`'s gradient.
  void accumulate(const torch::Tensor& weight, const torch::Tensor& x, const torch::Tensor& dy) const;
  // Adds the held GEMMs' gradients in the order they were held, then starts counting anew.
  void drain(const torch::Tensor& weight);

 private:
  const int64_t limit_;
  const MainGradsPtr main_grads_;
  int64_t calls_ = 0;
  std::vector<std::pair<torch::Tensor, torch::Tensor>> held_;
};

// y = x W^T with the weight gradient left to `deferral` (see above); x [..., in], weight [out, in].
torch::Tensor linear_with_deferred_wgrad(const torch::Tensor& x, const torch::Tensor& weight,
                                         const std::shared_ptr<WgradDeferral>& deferral);

}  // namespace fp8tron
