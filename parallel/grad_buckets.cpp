#include "parallel/grad_buckets.h"

#include <torch/csrc/autograd/utils/lambda_post_hook.h>

#include "core/error.h"

namespace fp8tron {

GradBuckets::GradBuckets(torch::Tensor grads, const std::vector<Param>& params, int64_t bucket_numel,
                         std::shared_ptr<Communicator> dp)
    : grads_(std::move(grads)), dp_(std::move(dp)) {
  FP8TRON_CHECK(bucket_numel > 0, "bucket size must be positive");
  std::vector<size_t> bucket_of(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    const auto& p = params[i];
    if (buckets_.empty() || buckets_.back().numel >= bucket_numel || buckets_.back().offset + buckets_.back().numel != p.offset)
      buckets_.push_back(Bucket{p.offset, 0});
    buckets_.back().numel += p.numel;
    ++buckets_.back().params;
    bucket_of[i] = buckets_.size() - 1;
  }
  // The padding after the last parameter (distributed-optimizer alignment) rides with the last bucket.
  if (!buckets_.empty()) buckets_.back().numel = grads_.numel() - buckets_.back().offset;
  for (size_t i = 0; i < params.size(); ++i) {
    auto accumulator = torch::autograd::impl::grad_accumulator(params[i].tensor);
    FP8TRON_CHECK(accumulator != nullptr, "a parameter without a gradient accumulator");
    const size_t b = bucket_of[i];
    accumulator->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
        [this, b](const torch::autograd::variable_list& outputs, const torch::autograd::variable_list&) {
          param_ready(b);
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

void GradBuckets::param_ready(size_t bucket) {
  if (!armed_) return;  // an earlier micro-batch: gradients are still accumulating
  Bucket& b = buckets_[bucket];
  if (--b.pending == 0) launch(b);
}

void GradBuckets::launch(Bucket& b) {
  torch::NoGradGuard no_grad;
  auto slice = grads_.narrow(0, b.offset, b.numel);
  slice.mul_(1.0 / dp_->size());  // average over data-parallel ranks
  b.work = dp_->all_reduce_async(slice, ReduceOp::Sum);
}

void GradBuckets::finish() {
  FP8TRON_CHECK(armed_, "finish() without arm()");
  for (auto& b : buckets_)
    if (!b.work) launch(b);  // parameters that received no gradient this step
  for (auto& b : buckets_) b.work->wait();
  armed_ = false;
}

}  // namespace fp8tron
