// Datasets that need no files: Megatron's --mock-data and fp8tron's --builtin-data (a learnable
// synthetic text). Both are pure functions of (split, global sample index): the same index gives
// the same tokens whatever the parallel layout, as Megatron's GPT dataset does.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include <torch/torch.h>

#include "trainer/config.h"

namespace fp8tron {

enum class Split { Train = 0, Valid = 1, Test = 2 };

class SampleSource {
 public:
  virtual ~SampleSource() = default;
  // Writes seq_length + 1 tokens of sample `index` of `split` into out.
  virtual void sample(Split split, int64_t index, int64_t* out) const = 0;
};

// Megatron's mock dataset: documents of pseudo-random length in [1, 4096) holding 1, 2, ..., n-1
// and an end-of-document token, packed back to back into samples.
std::unique_ptr<SampleSource> make_mock_source(int64_t seq_length, int64_t vocab_size, uint64_t seed);

// First-order Markov text over min(vocab, 1024) "active" tokens: each token has four possible
// successors with probabilities 0.55/0.25/0.15/0.05 (entropy 1.11 nats), so a small GPT's loss
// falls far below ln(vocab) within a few hundred steps.
std::unique_ptr<SampleSource> make_builtin_source(int64_t seq_length, int64_t vocab_size, uint64_t seed);

// Entropy rate of the built-in text in nats per token: the loss a perfect model reaches.
double builtin_source_entropy();

struct Batch {
  torch::Tensor tokens;     // [b, s] int64
  torch::Tensor labels;     // [b, s] int64 (tokens shifted by one)
  torch::Tensor loss_mask;  // [b, s] float32
};

// Assembles micro-batches of consecutive global sample indices and moves them to the device.
class BatchLoader {
 public:
  BatchLoader(std::shared_ptr<SampleSource> source, Split split, int64_t seq_length, int64_t micro_batch,
              torch::Device device);
  // The micro-batch starting at global sample index `first_sample`.
  Batch load(int64_t first_sample) const;

 private:
  std::shared_ptr<SampleSource> source_;
  Split split_;
  int64_t seq_length_, micro_batch_;
  torch::Device device_;
};

}  // namespace fp8tron
