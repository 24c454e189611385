// --overlap-grad-reduce: the data-parallel reduction of the flat gradient buffer, in buckets that
// start as soon as every gradient in them is final, while backward still runs (Megatron's
// param_and_grad_buffer). Buckets are contiguous ranges of the buffer holding whole parameters,
// launched in the same order on every rank (the order their gradients complete, which the
// identical autograd graphs make identical).
#pragma once
#include <torch/torch.h>

#include <memory>
#include <vector>

#include "parallel/communicator.h"

namespace fp8tron {

class GradBuckets {
 public:
  struct Param {
    torch::Tensor tensor;  // the parameter (its AccumulateGrad node gets the hook)
    int64_t offset = 0;    // where its gradient lies in `grads`
    int64_t numel = 0;
  };
  // `grads` is the flat gradient buffer; `params` cover [0, grads.numel()) in offset order.
  GradBuckets(torch::Tensor grads, const std::vector<Param>& params, int64_t bucket_numel, std::shared_ptr<Communicator> dp);

  // The coming backward pass gives the final gradients (last micro-batch): reduce as they come.
  void arm();
  // Launches buckets that did not complete (parameters without gradients) and waits for all;
  // gradients are then averaged over the data-parallel group.
  void finish();
  size_t num_buckets() const { return buckets_.size(); }

 private:
  struct Bucket {
    int64_t offset, numel;
    int params = 0;
    int pending = 0;
    std::unique_ptr<CommWork> work;
  };
  void param_ready(size_t bucket);
  void launch(Bucket& b);

  torch::Tensor grads_;
  std::shared_ptr<Communicator> dp_;
  std::vector<Bucket> buckets_;
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;  // keeps the hooked nodes alive
  bool armed_ = false;
};

}  // namespace fp8tron
