// Micro-batches for the model: a background thread reads samples ahead of the trainer, turns
// them into tokens / labels / loss mask (/ position ids, document segments) as Megatron's GPT
// dataset does, and stages them in pinned memory; load() copies them to the device
// asynchronously. Micro-batches are consumed at start indices first, first + stride,
// first + 2 stride, ... (Megatron's sampler); any other request is served directly.
#pragma once
#include <torch/torch.h>

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>

#include "data/loader/sample_source.h"

namespace fp8tron {

struct Batch {
  torch::Tensor tokens;        // [b, s] int64
  torch::Tensor labels;        // [b, s] int64 (tokens shifted by one)
  torch::Tensor loss_mask;     // [b, s] float32
  torch::Tensor position_ids;  // [b, s] int64, with --reset-position-ids only
  torch::Tensor segment_ids;   // [b, s] int32, with --reset-attention-mask only
};

struct BatchOptions {
  int64_t seq_length = 0;
  int64_t micro_batch_size = 0;
  int64_t eod = -1;  // end-of-document id, -1: none
  bool eod_mask_loss = false, reset_position_ids = false, reset_attention_mask = false;
  int64_t pad = -1;  // the tokenizer's pad id (masked like padding), -1: none
  // !--no-create-attention-mask-in-dataloader: document segments for --reset-attention-mask
  bool create_attention_mask = true;
  int prefetch = 2;      // micro-batches prepared ahead (0: no thread)
  int64_t stride = 0;    // distance between consecutive micro-batch starts (micro x data-parallel)
  // Token ids must lie in [0, vocab_size) (the tokenizer's vocabulary, before padding): an id
  // outside it (data tokenized with another tokenizer, a wrong --vocab-size) is a UserError naming
  // the split, sample, dataset, document and id. 0: unchecked.
  int64_t vocab_size = 0;
};

class BatchLoader {
 public:
  BatchLoader(std::shared_ptr<SampleSource> source, Split split, BatchOptions options, torch::Device device);
  ~BatchLoader();
  // The micro-batch starting at global sample index `first_sample`, on the device.
  Batch load(int64_t first_sample);
  bool has_data() const { return source_->has(split_); }

 private:
  struct Prepared {
    int64_t start;
    Batch host;
  };
  Batch prepare(int64_t start) const;  // on the host (pinned for a GPU)
  void check_token_ids(const std::vector<int64_t>& sample, int64_t index) const;
  void run();

  std::shared_ptr<SampleSource> source_;
  Split split_;
  BatchOptions options_;
  torch::Device device_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<Prepared> ready_;
  int64_t next_start_ = -1;  // what the thread prepares next; -1: nothing requested yet
  uint64_t generation_ = 0;  // bumped when the expected sequence restarts
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace fp8tron
