// --overlap-param-gather: after the distributed optimizer's step each data-parallel rank holds the
// new weights of its own shard only. The all-gather that completes the flat weight buffer is issued
// bucket by bucket without waiting (start(), right after the step), in the order the forward pass
// first uses the buckets, and the forward pass waits for a bucket only just before a module that
// uses its parameters runs (wait_for(), Megatron's forward pre-hooks). Anything else that reads the
// weights (evaluation, checkpoints, the end of training) calls finish() first.
// Buckets are those of GradBuckets (--ddp-bucket-size); each is an uneven all-gather from the
// owners of its elements (the shards are contiguous ranges of the buffer, see grad_buckets.cpp).
// --overlap-param-gather-with-optimizer-step splits the buckets where the model chunk changes, so
// that the first chunk's can be issued (start_first_chunk()) while the optimizer still updates the
// other chunks' parameters, whose buckets follow (start_other_chunks()).
#pragma once
#include <torch/torch.h>

#include <functional>
#include <memory>
#include <vector>

#include "parallel/communicator.h"
#include "parallel/grad_buckets.h"

namespace fp8tron {

// --fp8-param-gather: the buffer's first `numel` elements travel as the bytes of `codes` (same
// offsets), and `decode(codes, offset, numel)` runs once a bucket of them has arrived.
struct ParamGatherBytes {
  torch::Tensor codes;
  int64_t numel = 0;
  std::function<void(const torch::Tensor& codes, int64_t offset, int64_t numel)> decode;
};

class ParamGather {
 public:
  using Bytes = ParamGatherBytes;
  // `params` is the flat weight buffer; `layout` covers it in offset order; rank r of `dp` owns
  // [r * shard_numel, (r + 1) * shard_numel).
  // With `split_chunks` no bucket holds parameters of two model chunks (BufferParam::chunk).
  ParamGather(torch::Tensor params, const std::vector<BufferParam>& layout, int64_t bucket_numel, int64_t shard_numel,
              std::shared_ptr<Communicator> dp, Bytes bytes = {}, bool split_chunks = false);

  // Issues every bucket's all-gather (this rank's shard of `params` must hold its new weights).
  void start();
  // start() in two parts (with split_chunks): the buckets of model chunk 0 (waits for the previous
  // round first; this rank's shard of chunk 0's parameters must hold their new weights), then those
  // of the other chunks.
  void start_first_chunk();
  void start_other_chunks();
  // Waits for the buckets that hold `module`'s parameters (those in another buffer are skipped).
  void wait_for(const torch::nn::Module& module);
  // Waits for every bucket still in flight.
  void finish();
  bool in_flight() const { return in_flight_ > 0; }
  int buckets_in_flight() const { return in_flight_; }
  size_t num_buckets() const { return buckets_.size(); }

 private:
  struct Bucket {
    int64_t offset, numel;
    std::vector<int64_t> counts;
    std::unique_ptr<CommWork> work;
    bool bytes = false;  // gathers Bytes::codes
    int chunk = 0;       // the model chunk of its (first) parameter
  };
  void issue(Bucket& b);
  void wait(Bucket& b);

  torch::Tensor params_;
  Bytes bytes_;
  std::shared_ptr<Communicator> dp_;
  int64_t shard_numel_;
  std::vector<Bucket> buckets_;        // in offset order
  std::vector<size_t> launch_order_;   // by first use in the forward pass
  int in_flight_ = 0;
};

}  // namespace fp8tron
