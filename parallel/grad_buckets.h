// Data-parallel buckets of the flat parameter/gradient buffers (Megatron's param_and_grad_buffer):
// contiguous ranges holding whole parameters, communicated as units so that communication
// overlaps computation.
//  - GradBuckets (--overlap-grad-reduce): a bucket's reduction starts as soon as every gradient in
//    it is final, while backward still runs. Without the distributed optimizer it is an all-reduce;
//    with it, a reduction onto the ranks that own the bucket's elements (see GradBuckets).
//  - ParamGather (parallel/param_gather.h, --overlap-param-gather) uses the same buckets.
// Buckets are launched in the same order on every rank of the group (the order their gradients
// complete, which the identical autograd graphs make identical), as MPI and NCCL require.
#pragma once
#include <torch/torch.h>

#include <functional>
#include <memory>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "parallel/communicator.h"

namespace fp8tron {

// A parameter's place in a flat buffer.
struct BufferParam {
  torch::Tensor tensor;  // the parameter (its AccumulateGrad node gets the gradient hook)
  int64_t offset = 0;    // where it lies in the flat buffer
  int64_t numel = 0;
  int64_t first_use = 0;  // its position in the model's parameter list: forward order
  int chunk = 0;          // its model chunk (virtual pipeline stage) on this pipeline rank
};

// Buckets over a flat buffer of `buffer_numel` elements whose `params` are in offset order: a new
// bucket starts when the current one holds `bucket_numel` elements or more (or at a gap). The
// padding after the last parameter (distributed-optimizer alignment) rides with the last bucket.
// With `split_chunks` a bucket also ends where the next parameter belongs to another model chunk.
struct BucketSpan {
  int64_t offset = 0, numel = 0;
  std::vector<size_t> params;  // indices into `params`
};
std::vector<BucketSpan> bucket_spans(const std::vector<BufferParam>& params, int64_t bucket_numel, int64_t buffer_numel,
                                     bool split_chunks = false);

// How many elements of [offset, offset + numel) each of `ranks` contiguous shards of
// `shard_numel` elements owns (rank r owns [r * shard_numel, (r + 1) * shard_numel)): the counts
// of the uneven reduce-scatter / all-gather of that range.
std::vector<int64_t> shard_counts(int64_t offset, int64_t numel, int64_t shard_numel, int ranks);

class GradBuckets {
 public:
  using Param = BufferParam;
  struct Options {
    int64_t bucket_numel = 40000000;
    // 0: every bucket is all-reduced. > 0 (distributed optimizer): data-parallel rank r keeps
    // the elements [r * shard_numel, (r + 1) * shard_numel) of the buffer, and a bucket is
    // reduced onto the ranks owning its elements only (an uneven reduce-scatter; the other
    // ranks' copies of those elements are left unreduced).
    int64_t shard_numel = 0;
    // Buffer ranges (offset, numel) that another group must sum before the data-parallel
    // reduction (with shard_numel: the tied embedding's two pipeline copies, whose offsets, and
    // so whose shard owners, differ between the stages). Buckets touching them are not launched
    // during backward but in finish(), after `before_deferred`.
    std::vector<std::pair<int64_t, int64_t>> deferred;
    // With shard_numel and several distributed-optimizer instances (parallel/optimizer_instances.h):
    // `dp` is this rank's instance, and once a bucket's reduce-scatter there is done, this rank's
    // piece of it is all-reduced over `replicas` (the ranks owning the same shard in the other
    // instances). Null: one instance.
    std::shared_ptr<Communicator> replicas;
  };
  // `grads` is the flat gradient buffer; `params` cover [0, grads.numel()) in offset order.
  GradBuckets(torch::Tensor grads, const std::vector<Param>& params, const Options& options, std::shared_ptr<Communicator> dp);

  // The coming backward pass gives the final gradients (last micro-batch): reduce as they come.
  void arm();
  // Launches the buckets that did not complete (parameters without gradients), runs
  // `before_deferred`, launches the deferred buckets and waits for all. Gradients are then
  // summed over the data-parallel group (where this rank owns them, with shard_numel); the caller
  // scales the backward pass so that the sum is the mean (trainer.cpp, train_step).
  void finish(const std::function<void()>& before_deferred = {});
  size_t num_buckets() const { return buckets_.size(); }
  // --delay-wgrad-compute: the gradients of these parameters are completed by held work
  // (core/deferred_work.h) after autograd has passed them, so their accumulators' hooks are
  // ignored and param_done() (with the parameter's TensorImpl) reports them instead.
  void complete_later(const std::vector<torch::Tensor>& params);
  void param_done(const void* param);

 private:
  struct Bucket {
    int64_t offset, numel;
    int params = 0;
    int pending = 0;
    bool deferred = false;
    std::unique_ptr<CommWork> work;
    Communicator* group = nullptr;  // the group whose operation `work` is
  };
  void param_ready(size_t bucket);
  void launch(Bucket& b);

  torch::Tensor grads_;
  std::shared_ptr<Communicator> dp_;
  int64_t shard_numel_;
  std::shared_ptr<Communicator> replicas_;
  std::vector<Bucket> buckets_;
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;  // keeps the hooked nodes alive
  std::unordered_map<const void*, size_t> bucket_of_;  // parameter (TensorImpl) -> bucket
  std::unordered_set<const void*> later_;              // parameters reported by param_done()
  bool armed_ = false;
};

}  // namespace fp8tron
