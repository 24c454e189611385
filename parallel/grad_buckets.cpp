#include "parallel/grad_buckets.h"

#include <torch/csrc/autograd/utils/lambda_post_hook.h>

#include <algorithm>

#include "core/error.h"
#include "parallel/chained_all_reduce.h"

namespace fp8tron {

std::vector<BucketSpan> bucket_spans(const std::vector<BufferParam>& params, int64_t bucket_numel, int64_t buffer_numel,
                                     bool split_chunks) {
  FP8TRON_CHECK(bucket_numel > 0, "bucket size must be positive");
  std::vector<BucketSpan> spans;
  for (size_t i = 0; i < params.size(); ++i) {
    const auto& p = params[i];
    if (spans.empty() || spans.back().numel >= bucket_numel || spans.back().offset + spans.back().numel != p.offset ||
        (split_chunks && params[spans.back().params.back()].chunk != p.chunk))
      spans.push_back(BucketSpan{p.offset, 0, {}});
    spans.back().numel += p.numel;
    spans.back().params.push_back(i);
  }
  if (!spans.empty()) {
    FP8TRON_CHECK(buffer_numel >= spans.back().offset + spans.back().numel, "parameters beyond the buffer");
    spans.back().numel = buffer_numel - spans.back().offset;
  }
  return spans;
}

std::vector<int64_t> shard_counts(int64_t offset, int64_t numel, int64_t shard_numel, int ranks) {
  FP8TRON_CHECK(shard_numel > 0 && offset >= 0 && offset + numel <= shard_numel * ranks, "range outside the shards");
  std::vector<int64_t> counts(size_t(ranks), 0);
  for (int r = 0; r < ranks; ++r) {
    const int64_t lo = std::max(offset, r * shard_numel), hi = std::min(offset + numel, (r + 1) * shard_numel);
    counts[size_t(r)] = std::max<int64_t>(0, hi - lo);
  }
  return counts;
}

GradBuckets::GradBuckets(torch::Tensor grads, const std::vector<Param>& params, const Options& options,
                         std::shared_ptr<Communicator> dp)
    : grads_(std::move(grads)), dp_(std::move(dp)), shard_numel_(options.shard_numel), replicas_(options.replicas) {
  if (replicas_ && replicas_->size() == 1) replicas_.reset();
  FP8TRON_CHECK(!replicas_ || shard_numel_ > 0, "instances of the distributed optimizer need its shards");
  FP8TRON_CHECK(shard_numel_ == 0 || shard_numel_ * dp_->size() == grads_.numel(), "the shards must tile the buffer");
  const auto spans = bucket_spans(params, options.bucket_numel, grads_.numel());
  std::vector<size_t> bucket_of(params.size());
  for (size_t b = 0; b < spans.size(); ++b) {
    Bucket bucket{spans[b].offset, spans[b].numel, int(spans[b].params.size())};
    for (auto [off, n] : options.deferred)
      if (off < bucket.offset + bucket.numel && bucket.offset < off + n) bucket.deferred = true;
    buckets_.push_back(std::move(bucket));
    for (size_t i : spans[b].params) bucket_of[i] = b;
  }
  for (size_t i = 0; i < params.size(); ++i) {
    auto accumulator = torch::autograd::impl::grad_accumulator(params[i].tensor);
    FP8TRON_CHECK(accumulator != nullptr, "a parameter without a gradient accumulator");
    const size_t b = bucket_of[i];
    const void* key = params[i].tensor.unsafeGetTensorImpl();
    bucket_of_[key] = b;
    accumulator->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
        [this, b, key](const torch::autograd::variable_list& outputs, const torch::autograd::variable_list&) {
          if (!later_.count(key)) param_ready(b);
          return outputs;
        }));
    accumulators_.push_back(std::move(accumulator));
  }
}

void GradBuckets::arm() {
  armed_ = true;
  for (auto& b : buckets_) {
    b.pending = b.params;
    b.work.reset();
  }
}

void GradBuckets::complete_later(const std::vector<torch::Tensor>& params) {
  for (const auto& p : params)
    if (bucket_of_.count(p.unsafeGetTensorImpl())) later_.insert(p.unsafeGetTensorImpl());
}

void GradBuckets::param_done(const void* param) {
  if (!later_.count(param)) return;  // not in this buffer, or its hook reports it
  param_ready(bucket_of_.at(param));
}

void GradBuckets::param_ready(size_t bucket) {
  if (!armed_) return;  // an earlier micro-batch: gradients are still accumulating
  Bucket& b = buckets_[bucket];
  if (--b.pending == 0 && !b.deferred) launch(b);
}

// With the distributed optimizer the shards are contiguous ranges of the whole buffer (the layout
// checkpoints and the non-overlapped path use), so a bucket belongs to one owner, or to the few
// whose shards it straddles. Its reduction is an uneven reduce-scatter: on NCCL one group of
// ncclReduce calls, one per owner's piece. A ring reduce moves each element over every link once,
// so a bucket costs numel / bandwidth: between a reduce-scatter's (dp-1)/dp of that and an
// all-reduce's 2(dp-1)/dp (equal to the all-reduce at dp = 2), with half the all-reduce's traffic at
// large dp and no change to the shard layout. Megatron instead shards every bucket over all ranks
// (an even reduce-scatter per bucket), which would make each rank's optimizer state a union of
// per-bucket slices and change what checkpoints store.
void GradBuckets::launch(Bucket& b) {
  torch::NoGradGuard no_grad;
  auto slice = grads_.narrow(0, b.offset, b.numel);
  b.group = dp_.get();
  if (shard_numel_ == 0) {
    b.work = dp_->all_reduce_async(slice, ReduceOp::Sum);
    return;
  }
  const auto counts = shard_counts(b.offset, b.numel, shard_numel_, dp_->size());
  const int64_t mine = std::max(b.offset, dp_->rank() * shard_numel_);
  auto own = grads_.narrow(0, std::min(mine, b.offset + b.numel), counts[size_t(dp_->rank())]);  // in place
  b.work = dp_->reduce_scatter_v_async(own, slice, counts);
  // Megatron's partial distributed optimizer: the instance's sum of this rank's piece, summed
  // again over the instances (whose members own the same piece, so all skip an empty one).
  if (replicas_ && own.numel() > 0) {
    b.work = all_reduce_after(std::move(b.work), *dp_, *replicas_, own);
    b.group = replicas_.get();
  }
}

void GradBuckets::finish(const std::function<void()>& before_deferred) {
  FP8TRON_CHECK(armed_, "finish() without arm()");
  for (auto& b : buckets_)
    if (!b.work && !b.deferred) launch(b);  // parameters that received no gradient this step
  if (before_deferred) before_deferred();
  for (auto& b : buckets_)
    if (!b.work) launch(b);
  for (auto& b : buckets_) b.group->wait(*b.work);  // through the group's observer (exposed time)
  armed_ = false;
}

}  // namespace fp8tron
