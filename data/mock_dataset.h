// Megatron's MockGPTLowLevelDataset (--mock-data): 100000 documents whose lengths numpy draws
// from default_rng(0).integers(1, 4096, dtype=int32); document i holds 1, 2, ..., n-1 (modulo
// the vocabulary) followed by the tokenizer's end-of-document id. Megatron's mock GPT dataset is
// the GPT dataset over these documents with the split 1,1,1, so samples here are those Megatron
// trains on for the same --seed, --seq-length and tokenizer.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "data/low_level_dataset.h"

namespace fp8tron::data {

class MockLowLevelDataset : public LowLevelDataset {
 public:
  static constexpr int64_t kDocuments = 100000;     // MockGPTLowLevelDataset.size
  static constexpr int32_t kMaxLength = 4096;       // .max_sequence_length (exclusive)
  static constexpr uint64_t kSeed = 0;              // .seed

  MockLowLevelDataset(int64_t vocab_size, int64_t eod);

  int64_t num_sequences() const override { return kDocuments; }
  const PackedArray<int32_t>& sequence_lengths() const override { return lengths_view_; }
  void read(int64_t sequence, int64_t offset, int64_t length, int64_t* out) const override;
  std::string name() const override { return "Megatron's mock dataset"; }
  std::string identity() const override;
  std::string origin(int64_t sequence, int64_t token) const override;
  std::string default_cache_dir() const override { return ""; }

 private:
  int64_t vocab_size_, eod_;
  std::vector<int32_t> lengths_;
  PackedArray<int32_t> lengths_view_;
};

}  // namespace fp8tron::data
