// Megatron's BlendedDataset: a weighted mixture of datasets. Sample i of the blend is sample
// dataset_sample_index[i] of dataset dataset_index[i]; the two indices are built by a greedy
// rule that keeps every prefix of the blend as close to the weights as possible (at each step
// pick the dataset whose count lags its target weight * step the most). The result is
// deterministic, needs no random numbers, and matches Megatron's helpers.cpp sample for sample.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "data/data_spec.h"
#include "data/index_cache.h"
#include "data/npy_file.h"
#include "data/sample_dataset.h"

namespace fp8tron::data {

// build_blending_indices: `size` samples drawn in proportion to normalized `weights`.
void build_blending_indices(const std::vector<double>& weights, int64_t size, int16_t* dataset_index,
                            int64_t* dataset_sample_index);

// build_exhaustive_blending_indices: exactly sizes[i] samples of dataset i, interleaved in
// proportion to the sizes.
void build_exhaustive_blending_indices(const std::vector<int64_t>& sizes, int16_t* dataset_index,
                                       int64_t* dataset_sample_index);

class BlendedDataset : public SampleDataset {
 public:
  // weights: relative weights (normalized here) when `size` is set; exact per-dataset sample
  // counts when it is not (exhaustive blend). cache_dir "" keeps the indices in memory.
  BlendedDataset(std::vector<std::shared_ptr<const SampleDataset>> datasets, std::vector<double> weights,
                 std::optional<int64_t> size, Split split, const std::string& cache_dir);

  int64_t size() const override { return size_; }
  int64_t sample_length() const override { return datasets_[0]->sample_length(); }
  void sample(int64_t index, int64_t* out) const override;
  std::string identity() const override { return description_; }
  std::string token_origin(int64_t index, int64_t position) const override {
    return datasets_[size_t(dataset_of(index))]->token_origin(sample_in_dataset(index), position);
  }

  int dataset_of(int64_t index) const;
  int64_t sample_in_dataset(int64_t index) const;
  const std::vector<double>& weights() const { return weights_; }

 private:
  void build(int16_t* dataset_index, int64_t* dataset_sample_index) const;
  void check_not_oversampled(const int16_t* dataset_index) const;

  std::vector<std::shared_ptr<const SampleDataset>> datasets_;
  std::vector<double> weights_;
  std::optional<int64_t> requested_size_;
  Split split_;
  int64_t size_ = 0;
  std::string description_;
  // Either mapped from the cache or held in memory.
  NpyArray cached_dataset_index_, cached_sample_index_;
  std::vector<int16_t> dataset_index_;
  std::vector<int64_t> dataset_sample_index_;
};

}  // namespace fp8tron::data
