// What a GPT dataset samples from (Megatron's "low-level dataset"): a list of token sequences of
// known lengths. Implementations: the indexed dataset of a --data-path prefix (indexed_dataset.h)
// and Megatron's mock documents (mock_dataset.h).
#pragma once
#include <cstdint>
#include <string>

#include "data/mapped_file.h"

namespace fp8tron::data {

class LowLevelDataset {
 public:
  virtual ~LowLevelDataset() = default;

  virtual int64_t num_sequences() const = 0;
  virtual const PackedArray<int32_t>& sequence_lengths() const = 0;
  int32_t sequence_length(int64_t i) const { return sequence_lengths()[i]; }
  // Tokens [offset, offset + length) of sequence i, widened to int64.
  virtual void read(int64_t sequence, int64_t offset, int64_t length, int64_t* out) const = 0;

  // How messages name it: the path prefix, or "Megatron's mock dataset".
  virtual std::string name() const = 0;
  // Lines ("key: value\n") that change whenever its sequences would: part of the description
  // that keys the cached GPT indices.
  virtual std::string identity() const = 0;
  // Where token `token` of sequence `sequence` comes from, for error messages.
  virtual std::string origin(int64_t sequence, int64_t token) const = 0;
  // Where the GPT indices are cached when --data-cache-path is not given; "" keeps them in
  // memory (Megatron does not cache the mock dataset's).
  virtual std::string default_cache_dir() const = 0;
};

}  // namespace fp8tron::data
