// Linears whose weight-gradient GEMMs (dW = dY^T X) wait in a queue (core/deferred_work.h,
// fp8/held_wgrad.h) instead of running in the backward pass. Two of Megatron's flags use it:
//
// --delay-wgrad-compute (with --overlap-moe-expert-parallel-comm): every linear of the transformer
// layers holds its weight gradient; the combined 1F1B schedule runs the queue while the same
// backward pass's next all-to-all is in flight, and at the pass's end (Megatron's `backward_dw`,
// TE's delay_wgrad_compute). The weight stays an input of the node, which returns no gradient for
// it: the held work adds it (into the fp32 main gradient, or as AccumulateGrad would).
//
// --defer-embedding-wgrad-compute for the output layer of the last pipeline stage (WgradDeferral):
// the weight-gradient GEMMs of the step's first --wgrad-deferral-limit micro-batches (0: all) wait
// until its pipeline schedule has run. The stage then hands each input gradient to the previous
// stage as soon as it has it and computes the vocabulary-wide weight gradients while the other
// stages finish their backward passes (the pipeline flush), instead of in between. Here the weight
// enters detached, so no micro-batch's autograd pass touches it: its gradient is added only by the
// held work (in the backward pass for the micro-batches past the limit, in drain() for the rest),
// and no gradient-ready hook fires for it, so an overlapped data-parallel reduction takes its
// bucket after drain() (GradBuckets::finish launches the buckets that never completed).
#pragma once
#include <torch/torch.h>

#include <memory>

#include "core/deferred_work.h"
#include "models/linear/main_grads.h"

namespace fp8tron {

// y = x W^T (+ b) for x [..., in], weight [out, in] (a parameter), bias [out] or undefined, whose
// weight gradient is held in `queue` (null: added in the backward pass). The input and bias
// gradients are those of at::linear, and so is the weight's, added where autograd would add it
// (into its fp32 main gradient by the GEMM under gradient-accumulation fusion, the bias's there
// from the same GEMM call, held with it, as the fused linear computes it).
torch::Tensor linear_with_held_wgrad(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias,
                                     std::shared_ptr<DeferredWork> queue, const MainGradsPtr& main_grads);

class WgradDeferral {
 public:
  WgradDeferral(int64_t limit, MainGradsPtr main_grads) : limit_(limit), main_grads_(std::move(main_grads)) {}

  // Whether the next training forward's weight gradient waits for drain(): the first `limit`
  // forwards since the last drain (all of them with limit 0).
  bool defer_next() { return limit_ == 0 || calls_++ < limit_; }
  // Adds the held GEMMs' gradients in the order they were held, then starts counting anew.
  void drain();

  // y = x W^T with the weight gradient left to this deferral; x [..., in], weight [out, in].
  torch::Tensor linear(const torch::Tensor& x, const torch::Tensor& weight);

 private:
  const int64_t limit_;
  const MainGradsPtr main_grads_;
  int64_t calls_ = 0;
  std::shared_ptr<DeferredWork> held_ = std::make_shared<DeferredWork>();
};

}  // namespace fp8tron
