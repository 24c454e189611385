#include "data/loader/batch_loader.h"

#include "data/gpt_inputs.h"

#include <algorithm>

#include "core/error.h"
#include "core/text.h"
#include "data/sample_dataset.h"

namespace fp8tron {

BatchLoader::BatchLoader(std::shared_ptr<SampleSource> source, Split split, BatchOptions options, torch::Device device)
    : source_(std::move(source)), split_(split), options_(options), device_(device) {
  if (options_.prefetch > 0 && options_.stride > 0) thread_ = std::thread([this] { run(); });
}

BatchLoader::~BatchLoader() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  changed_.notify_all();
  if (thread_.joinable()) thread_.join();
}

Batch BatchLoader::prepare(int64_t start) const {
  const int64_t b = options_.micro_batch_size, s = options_.seq_length;
  auto host = [&](torch::Dtype dtype) {
    auto t = torch::empty({b, s}, dtype);
    return device_.is_cuda() ? t.pin_memory() : t;
  };
  Batch batch;
  batch.tokens = host(torch::kInt64);
  batch.labels = host(torch::kInt64);
  batch.loss_mask = host(torch::kFloat32);
  batch.position_ids = host(torch::kInt64);
  // Without the dataloader's attention mask (Megatron's --no-create-attention-mask-in-dataloader)
  // attention stays causal, so documents are not separated.
  const bool document_mask = options_.reset_attention_mask && options_.create_attention_mask;
  if (document_mask) batch.segment_ids = host(torch::kInt32);
  data::GptInputOptions gpt{options_.eod_mask_loss, options_.reset_position_ids, document_mask, options_.pad};
  std::vector<int64_t> sample(size_t(s + 1));
  for (int64_t i = 0; i < b; ++i) {
    source_->sample(split_, start + i, sample.data());
    check_token_ids(sample, start + i);
    data::make_gpt_inputs(sample.data(), s, options_.eod, gpt, batch.tokens.data_ptr<int64_t>() + i * s,
                          batch.labels.data_ptr<int64_t>() + i * s, batch.loss_mask.data_ptr<float>() + i * s,
                          batch.position_ids.data_ptr<int64_t>() + i * s,
                          batch.segment_ids.defined() ? batch.segment_ids.data_ptr<int32_t>() + i * s : nullptr);
  }
  if (!options_.reset_position_ids) batch.position_ids = torch::Tensor();  // positions are 0..s-1
  return batch;
}

void BatchLoader::check_token_ids(const std::vector<int64_t>& sample, int64_t index) const {
  if (options_.vocab_size <= 0) return;
  // One branch-free pass (vectorised); the offending position is searched only on failure.
  int64_t low = 0, high = 0;
  for (int64_t id : sample) {
    low = std::min(low, id);
    high = std::max(high, id);
  }
  if (high < options_.vocab_size && low >= data::kPadTokenId) return;
  size_t at = 0;
  while (at < sample.size() && sample[at] >= data::kPadTokenId && sample[at] < options_.vocab_size) ++at;
  const std::string origin = source_->token_origin(split_, index, int64_t(at));
  const char* split = split_ == Split::Train ? "train" : split_ == Split::Valid ? "validation" : "test";
  throw UserError(strprintf("token id %lld in %s sample %lld (position %zu%s%s) is outside the vocabulary of %lld "
                            "tokens: the data was tokenized with another tokenizer than this run's "
                            "(--tokenizer-type, --vocab-file, --tokenizer-model), or --vocab-size is wrong",
                            (long long)sample[at], split, (long long)index, at, origin.empty() ? "" : "; ",
                            origin.c_str(), (long long)options_.vocab_size));
}

void BatchLoader::run() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    changed_.wait(lock, [&] { return stop_ || (next_start_ >= 0 && int(ready_.size()) < options_.prefetch); });
    if (stop_) return;
    const int64_t start = next_start_;
    const uint64_t generation = generation_;
    lock.unlock();
    Batch batch;
    bool ok = true;
    try {
      batch = prepare(start);
    } catch (...) {
      ok = false;  // e.g. past the end of the data: the trainer's direct load reports it
    }
    lock.lock();
    if (generation != generation_) continue;  // the trainer moved elsewhere meanwhile
    try {
      if (ok) ready_.push_back({start, std::move(batch)});
    } catch (...) {
      ok = false;  // out of host memory: the trainer's direct load goes on without this batch
    }
    next_start_ = ok ? start + options_.stride : -1;
    // Also on failure: load() may be waiting for exactly this batch, and then prepares it itself
    // to report the error.
    changed_.notify_all();
  }
}

Batch BatchLoader::load(int64_t first_sample) {
  Batch host;
  bool found = false;
  if (thread_.joinable()) {
    std::unique_lock<std::mutex> lock(mutex_);
    // Wait for the thread if it is working on exactly this batch.
    changed_.wait(lock, [&] { return !ready_.empty() || next_start_ != first_sample; });
    while (!ready_.empty() && ready_.front().start < first_sample) ready_.pop_front();
    if (!ready_.empty() && ready_.front().start == first_sample) {
      host = std::move(ready_.front().host);
      ready_.pop_front();
      found = true;
    } else {
      ready_.clear();
      ++generation_;
      next_start_ = first_sample + options_.stride;
    }
    changed_.notify_all();
  }
  if (!found) host = prepare(first_sample);
  auto move = [&](const torch::Tensor& t) { return t.defined() ? t.to(device_, /*non_blocking=*/true) : t; };
  return Batch{move(host.tokens), move(host.labels), move(host.loss_mask), move(host.position_ids), move(host.segment_ids)};
}

}  // namespace fp8tron
