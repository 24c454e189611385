#include "data/blended_dataset.h"

#include <limits>

#include "core/error.h"
#include "core/text.h"

namespace fp8tron::data {

void build_blending_indices(const std::vector<double>& weights, int64_t size, int16_t* dataset_index,
                            int64_t* dataset_sample_index) {
  std::vector<int64_t> taken(weights.size(), 0);
  for (int64_t s = 0; s < size; ++s) {
    // Error of dataset d after s samples: how far its count lags weights[d] * s. (Megatron uses
    // max(s, 1) so that the first pick is the heaviest dataset.) Ties go to the lowest index.
    const double steps = std::max(double(s), 1.0);
    size_t best = 0;
    double best_error = weights[0] * steps - double(taken[0]);
    for (size_t d = 1; d < weights.size(); ++d) {
      const double error = weights[d] * steps - double(taken[d]);
      if (error > best_error) {
        best_error = error;
        best = d;
      }
    }
    dataset_index[s] = int16_t(best);
    dataset_sample_index[s] = taken[best]++;
  }
}

void build_exhaustive_blending_indices(const std::vector<int64_t>& sizes, int16_t* dataset_index,
                                       int64_t* dataset_sample_index) {
  int64_t total = 0;
  for (int64_t n : sizes) total += n;
  std::vector<double> weights;
  for (int64_t n : sizes) weights.push_back(double(n) / double(total));
  std::vector<int64_t> taken(sizes.size(), 0);
  std::vector<bool> spent(sizes.size(), false);
  for (size_t d = 0; d < sizes.size(); ++d) spent[d] = sizes[d] == 0;
  for (int64_t s = 0; s < total; ++s) {
    const double steps = std::max(double(s), 1.0);
    int64_t best = -1;
    double best_error = std::numeric_limits<double>::lowest();
    for (size_t d = 0; d < sizes.size(); ++d) {
      if (spent[d]) continue;  // a dataset that has given all its samples drops out
      const double error = weights[d] * steps - double(taken[d]);
      if (error > best_error) {
        best_error = error;
        best = int64_t(d);
      }
    }
    dataset_index[s] = int16_t(best);
    dataset_sample_index[s] = taken[size_t(best)]++;
    if (taken[size_t(best)] == sizes[size_t(best)]) spent[size_t(best)] = true;
  }
}

BlendedDataset::BlendedDataset(std::vector<std::shared_ptr<const SampleDataset>> datasets, std::vector<double> weights,
                               std::optional<int64_t> size, Split split, const std::string& cache_dir)
    : datasets_(std::move(datasets)), weights_(std::move(weights)), requested_size_(size), split_(split) {
  FP8TRON_CHECK(!datasets_.empty() && datasets_.size() == weights_.size(), "one weight per dataset");
  FP8TRON_CHECK(datasets_.size() < 32767, "dataset_index is int16");
  for (double w : weights_) FP8TRON_CHECK(w > 0, "blend weights must be positive");
  if (size) {
    weights_ = normalize(weights_);
    size_ = *size;
  } else {
    for (double w : weights_) size_ += int64_t(w);
  }
  std::string text = strprintf("fp8tron BlendedDataset indices (format 1)\nsplit: %s\nsize: %s\nweights:",
                               split_name(split_), size ? std::to_string(*size).c_str() : "None");
  for (double w : weights_) text += strprintf(" %.17g", w);
  text += "\n";
  for (const auto& d : datasets_) text += "dataset: " + hash_hex(d->identity()) + "\n";
  description_ = text;

  if (cache_dir.empty()) {
    dataset_index_.resize(size_t(size_));
    dataset_sample_index_.resize(size_t(size_));
    build(dataset_index_.data(), dataset_sample_index_.data());
    return;
  }
  CacheEntry entry{cache_dir, strprintf("fp8tron-%s-BlendedDataset-%s", hash_hex(description_).c_str(), split_name(split_)),
                   description_, {"dataset_index.npy", "dataset_sample_index.npy"}};
  ensure_cached(entry, [this](const std::vector<std::string>& paths) {
    std::vector<int16_t> dataset_index(static_cast<size_t>(size_));
    std::vector<int64_t> sample_index(static_cast<size_t>(size_));
    build(dataset_index.data(), sample_index.data());
    save_npy(paths[0], NpyType::Int16, {size_}, dataset_index.data());
    save_npy(paths[1], NpyType::Int64, {size_}, sample_index.data());
  });
  cached_dataset_index_ = NpyArray(entry.path("dataset_index.npy"));
  cached_sample_index_ = NpyArray(entry.path("dataset_sample_index.npy"));
  if (cached_dataset_index_.numel() != size_ || cached_sample_index_.numel() != size_)
    throw UserError(strprintf("the cached blend indices %s* are inconsistent: delete them so they are rebuilt",
                              entry.path("").c_str()));
}

void BlendedDataset::build(int16_t* dataset_index, int64_t* dataset_sample_index) const {
  if (requested_size_) {
    build_blending_indices(weights_, size_, dataset_index, dataset_sample_index);
  } else {
    std::vector<int64_t> sizes;
    for (double w : weights_) sizes.push_back(int64_t(w));
    build_exhaustive_blending_indices(sizes, dataset_index, dataset_sample_index);
  }
  check_not_oversampled(dataset_index);
}

void BlendedDataset::check_not_oversampled(const int16_t* dataset_index) const {
  std::vector<int64_t> counts(datasets_.size(), 0);
  for (int64_t i = 0; i < size_; ++i) ++counts[size_t(dataset_index[i])];
  for (size_t d = 0; d < datasets_.size(); ++d)
    if (counts[d] > datasets_[d]->size())
      throw UserError(strprintf("the %s blend needs %lld samples from dataset %zu, which has only %lld: its "
                                "sample margin (mid_level_dataset_surplus) is too small for these weights",
                                split_name(split_), (long long)counts[d], d, (long long)datasets_[d]->size()));
}

int BlendedDataset::dataset_of(int64_t index) const {
  return dataset_index_.empty() ? int(cached_dataset_index_.at(index)) : dataset_index_[size_t(index)];
}

int64_t BlendedDataset::sample_in_dataset(int64_t index) const {
  return dataset_sample_index_.empty() ? cached_sample_index_.at(index) : dataset_sample_index_[size_t(index)];
}

void BlendedDataset::sample(int64_t index, int64_t* out) const {
  FP8TRON_CHECK(index >= 0 && index < size_, strprintf("sample %lld of %lld", (long long)index, (long long)size_));
  datasets_[size_t(dataset_of(index))]->sample(sample_in_dataset(index), out);
}

}  // namespace fp8tron::data
