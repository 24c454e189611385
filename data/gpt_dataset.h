// Megatron's GPTDataset: fixed-length samples cut from the token stream of a range of documents.
//
// Three indices, built once per (dataset, documents, samples, seq_length, seed) and cached (in
// memory where the dataset has no cache directory, as Megatron keeps the mock dataset's):
//   document_index  the documents of every epoch, shuffled (int32)
//   sample_index    [num_samples + 1, 2]: (position in document_index, token offset) where each
//                   sample starts; sample i runs from row i to row i + 1 plus one extra token, so
//                   samples cross document boundaries and consecutive samples share one token
//   shuffle_index   a permutation of the samples
// Epochs: as many as needed for the requested samples. When the last epoch would be used for less
// than 80% of its samples, it is shuffled separately from the others ("separate final epoch") so
// its partial use does not bias which documents are seen. Random numbers come from
// numpy.random.RandomState(seed), reproduced exactly (numpy_random.h): the indices are
// byte-identical to Megatron's for the same documents and parameters.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "data/data_spec.h"
#include "data/index_cache.h"
#include "data/low_level_dataset.h"
#include "data/npy_file.h"
#include "data/numpy_random.h"
#include "data/sample_dataset.h"

namespace fp8tron::data {

struct GptDatasetConfig {
  int64_t sequence_length = 0;
  uint32_t seed = 1234;                      // --seed
  bool add_extra_token_to_sequence = true;   // samples of sequence_length + 1 tokens
  bool drop_last_partial_validation_sequence = true;
  std::string cache_dir;                     // --data-cache-path; "" = the dataset's default_cache_dir()
};

// ---- Index construction (pure functions; the dataset caches their results) -----------------

// Megatron's _get_num_epochs: enough epochs for num_samples * seq_length + extra tokens; one
// epoch when num_samples is unset.
int64_t gpt_num_epochs(int64_t tokens_per_epoch, std::optional<int64_t> num_samples, int64_t sequence_length,
                       int extra_token);

// Whether the final epoch is shuffled on its own (it would supply < 80% of its samples).
bool gpt_separate_final_epoch(int64_t tokens_per_epoch, int64_t num_epochs, int64_t num_samples,
                              int64_t sequence_length, int extra_token);

// Sequences [begin, end) repeated num_epochs times and shuffled (_build_document_index).
std::vector<int32_t> build_document_index(int64_t begin, int64_t end, int64_t num_epochs, NumpyRandomState& rng,
                                          bool separate_final_epoch);

// helpers.cpp's build_sample_idx, flattened [rows * 2]; T is int32 or int64.
template <class T>
std::vector<T> build_sample_index(const PackedArray<int32_t>& sizes, const std::vector<int32_t>& document_index,
                                  int32_t sequence_length, int32_t num_epochs, int64_t tokens_per_epoch,
                                  bool drop_last_partial_sequence, int extra_token);

// [0, num_samples) shuffled, then [num_samples, total_size) shuffled (_build_shuffle_index).
template <class T>
std::vector<T> build_shuffle_index(int64_t num_samples, int64_t total_size, NumpyRandomState& rng);

// ---- The dataset ---------------------------------------------------------------------------

class GptDataset : public SampleDataset {
 public:
  // Samples from sequences [range.first, range.second) of `data`. num_samples: the minimum number
  // of samples wanted (nullopt: one epoch). Builds or loads the cached indices.
  GptDataset(std::shared_ptr<const LowLevelDataset> data, std::pair<int64_t, int64_t> range,
             std::optional<int64_t> num_samples, Split split, const GptDatasetConfig& config);

  int64_t size() const override { return size_; }
  int64_t sample_length() const override { return config_.sequence_length + extra_; }
  void sample(int64_t index, int64_t* out) const override;
  std::string identity() const override { return cache_.description; }
  std::string token_origin(int64_t index, int64_t position) const override;

  int64_t num_epochs() const { return num_epochs_; }
  int64_t tokens_per_epoch() const { return tokens_per_epoch_; }
  bool built_indices() const { return built_; }  // false when loaded from the cache
  bool cached() const { return !cache_.dir.empty(); }
  std::string cache_path(const std::string& suffix) const { return cache_.path(suffix); }
  const NpyArray& document_index() const { return document_index_; }
  const NpyArray& sample_index() const { return sample_index_; }
  const NpyArray& shuffle_index() const { return shuffle_index_; }

 private:
  // The three indices as (type, shape, bytes), in the order of CacheEntry::suffixes.
  struct BuiltArray {
    NpyType type;
    std::vector<int64_t> shape;
    std::vector<char> bytes;
  };
  std::string description() const;
  std::vector<BuiltArray> build() const;

  std::shared_ptr<const LowLevelDataset> data_;
  std::pair<int64_t, int64_t> range_;
  std::optional<int64_t> num_samples_;
  Split split_;
  GptDatasetConfig config_;
  int extra_ = 1;
  int64_t tokens_per_epoch_ = 0, num_epochs_ = 0, size_ = 0;
  bool built_ = false;
  CacheEntry cache_;
  NpyArray document_index_, sample_index_, shuffle_index_;
};

}  // namespace fp8tron::data
