#include "parallel/param_gather.h"

#include <algorithm>
#include <numeric>

#include "core/error.h"

namespace fp8tron {

ParamGather::ParamGather(torch::Tensor params, const std::vector<BufferParam>& layout, int64_t bucket_numel,
                         int64_t shard_numel, std::shared_ptr<Communicator> dp, Bytes bytes, bool split_chunks)
    : params_(std::move(params)), bytes_(std::move(bytes)), dp_(std::move(dp)), shard_numel_(shard_numel) {
  FP8TRON_CHECK(params_.is_contiguous() && params_.dim() == 1, "the weight buffer must be flat");
  FP8TRON_CHECK(shard_numel_ * dp_->size() == params_.numel(), "the shards must tile the buffer");
  // Byte-published parameters lie first; their buckets end where they end.
  std::vector<BufferParam> byte_params, rest;
  for (const auto& p : layout) (p.offset < bytes_.numel ? byte_params : rest).push_back(p);
  std::vector<int64_t> first_use;
  auto add = [&](const std::vector<BufferParam>& part, int64_t end, bool as_bytes) {
    for (const auto& span : bucket_spans(part, bucket_numel, end, split_chunks)) {
      buckets_.push_back(Bucket{span.offset, span.numel, shard_counts(span.offset, span.numel, shard_numel_, dp_->size()),
                                nullptr, as_bytes, part[span.params.front()].chunk});
      int64_t first = INT64_MAX;
      for (size_t i : span.params) first = std::min(first, part[i].first_use);
      first_use.push_back(first);
    }
  };
  add(byte_params, bytes_.numel, true);
  add(rest, params_.numel(), false);
  // The buffer is ordered by weight decay before model order (the first layer's norms sit near the
  // end), so offset order is not forward order: launch by each bucket's earliest-used parameter.
  launch_order_.resize(buckets_.size());
  std::iota(launch_order_.begin(), launch_order_.end(), size_t(0));
  std::stable_sort(launch_order_.begin(), launch_order_.end(), [&](size_t a, size_t b) { return first_use[a] < first_use[b]; });
}

void ParamGather::start() {
  finish();  // the previous round must be done before this rank's shard is read again
  for (size_t i : launch_order_) issue(buckets_[i]);
}

void ParamGather::start_first_chunk() {
  finish();
  for (size_t i : launch_order_)
    if (buckets_[i].chunk == 0) issue(buckets_[i]);
}

void ParamGather::start_other_chunks() {
  for (size_t i : launch_order_)
    if (buckets_[i].chunk != 0) issue(buckets_[i]);
}

void ParamGather::issue(Bucket& b) {
  FP8TRON_CHECK(!b.work, "a parameter bucket's all-gather issued twice");
  torch::Tensor& buffer = b.bytes ? bytes_.codes : params_;
  auto whole = buffer.narrow(0, b.offset, b.numel);
  const int64_t mine = std::max(b.offset, dp_->rank() * shard_numel_);
  auto own = buffer.narrow(0, std::min(mine, b.offset + b.numel), b.counts[size_t(dp_->rank())]);  // in place
  b.work = dp_->all_gather_v_async(whole, own, b.counts);
  ++in_flight_;
}

void ParamGather::wait(Bucket& b) {
  if (!b.work) return;
  dp_->wait(*b.work);  // through the group's observer (exposed time)
  b.work.reset();
  --in_flight_;
  if (b.bytes) bytes_.decode(bytes_.codes.narrow(0, b.offset, b.numel), b.offset, b.numel);
}

void ParamGather::wait_for(const torch::nn::Module& module) {
  if (in_flight_ == 0) return;
  const auto* base = static_cast<const char*>(params_.data_ptr());
  const int64_t element = params_.element_size();
  for (const auto& p : module.parameters()) {
    const int64_t offset = (static_cast<const char*>(p.data_ptr()) - base) / element;
    // Another buffer's (a mixture-of-experts model gathers its expert weights separately).
    if (p.device() != params_.device() || offset < 0 || offset + p.numel() > params_.numel()) continue;
    // The last bucket starting at or before the parameter holds it (buckets hold whole parameters).
    auto it = std::upper_bound(buckets_.begin(), buckets_.end(), offset,
                               [](int64_t off, const Bucket& b) { return off < b.offset; });
    FP8TRON_CHECK(it != buckets_.begin(), "no bucket holds the parameter");
    wait(*std::prev(it));
  }
}

void ParamGather::finish() {
  for (auto& b : buckets_) wait(b);
}

}  // namespace fp8tron
