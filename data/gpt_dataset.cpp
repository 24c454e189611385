#include "data/gpt_dataset.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

#include "core/error.h"
#include "core/text.h"

namespace fp8tron::data {

int64_t gpt_num_epochs(int64_t tokens_per_epoch, std::optional<int64_t> num_samples, int64_t sequence_length,
                       int extra_token) {
  if (!num_samples) return 1;
  const int64_t requested = *num_samples * sequence_length + extra_token;
  int64_t epochs = 1, tokens = tokens_per_epoch;
  while (tokens < requested) {
    ++epochs;
    tokens += tokens_per_epoch;
  }
  return epochs;
}

bool gpt_separate_final_epoch(int64_t tokens_per_epoch, int64_t num_epochs, int64_t num_samples,
                              int64_t sequence_length, int extra_token) {
  if (num_epochs == 1) return false;
  const int64_t sans_final = ((num_epochs - 1) * tokens_per_epoch - extra_token) / sequence_length;
  const int64_t from_final = num_samples - sans_final;
  const int64_t per_epoch = (tokens_per_epoch - extra_token) / sequence_length;
  FP8TRON_CHECK(from_final >= 0 && from_final <= per_epoch + 1, "inconsistent epoch arithmetic");
  return from_final < int64_t(0.80 * double(per_epoch));
}

std::vector<int32_t> build_document_index(int64_t begin, int64_t end, int64_t num_epochs, NumpyRandomState& rng,
                                          bool separate_final_epoch) {
  if (separate_final_epoch && num_epochs > 1) {
    // The first epochs are shuffled together, the last one on its own, from the same generator.
    auto first = build_document_index(begin, end, num_epochs - 1, rng, false);
    auto last = build_document_index(begin, end, 1, rng, false);
    first.insert(first.end(), last.begin(), last.end());
    return first;
  }
  std::vector<int32_t> index;
  index.reserve(size_t((end - begin) * num_epochs));
  for (int64_t e = 0; e < num_epochs; ++e)
    for (int64_t d = begin; d < end; ++d) index.push_back(int32_t(d));
  rng.shuffle(index.data(), int64_t(index.size()));
  return index;
}

template <class T>
std::vector<T> build_sample_index(const PackedArray<int32_t>& sizes, const std::vector<int32_t>& document_index,
                                  int32_t sequence_length, int32_t num_epochs, int64_t tokens_per_epoch,
                                  bool drop_last_partial_sequence, int extra_token) {
  FP8TRON_CHECK(sequence_length > 1 && num_epochs > 0 && tokens_per_epoch > 1, "degenerate sample index");
  const int64_t stream = num_epochs * tokens_per_epoch - extra_token;
  // Without dropping, Megatron rounds up in single precision (float(...)); kept for identical counts.
  const int64_t num_samples = drop_last_partial_sequence
                                  ? stream / sequence_length
                                  : int64_t(std::ceil(float(stream) / float(sequence_length)));
  std::vector<T> index(static_cast<size_t>(2 * (num_samples + 1)));
  const int64_t last_document = int64_t(document_index.size()) - 1;
  int64_t row = 0;
  T doc = 0, offset = 0;  // position in document_index, token offset in that document
  index[0] = doc;
  index[1] = offset;
  while (++row <= num_samples) {
    int64_t remaining = sequence_length + extra_token;
    while (remaining != 0) {
      const int64_t length = sizes[document_index[size_t(doc)]] - offset;
      remaining -= length;
      if (remaining <= 0) {
        // The sample ends inside this document. The next one starts `extra_token` earlier: the
        // extra token is the last label of this sample and the first input of the next.
        offset += T(remaining + length - extra_token);
        remaining = 0;
      } else if (doc == last_document) {
        offset = T(sizes[document_index[size_t(doc)]] - extra_token);  // out of data: a partial sample
        break;
      } else {
        ++doc;
        offset = 0;
      }
    }
    index[size_t(2 * row)] = doc;
    index[size_t(2 * row + 1)] = offset;
  }
  return index;
}

template <class T>
std::vector<T> build_shuffle_index(int64_t num_samples, int64_t total_size, NumpyRandomState& rng) {
  std::vector<T> index(static_cast<size_t>(total_size));
  for (int64_t i = 0; i < total_size; ++i) index[size_t(i)] = T(i);
  rng.shuffle(index.data(), num_samples);
  if (num_samples < total_size) rng.shuffle(index.data() + num_samples, total_size - num_samples);
  return index;
}

template std::vector<int32_t> build_sample_index<int32_t>(const PackedArray<int32_t>&, const std::vector<int32_t>&,
                                                          int32_t, int32_t, int64_t, bool, int);
template std::vector<int64_t> build_sample_index<int64_t>(const PackedArray<int32_t>&, const std::vector<int32_t>&,
                                                          int32_t, int32_t, int64_t, bool, int);
template std::vector<uint32_t> build_shuffle_index<uint32_t>(int64_t, int64_t, NumpyRandomState&);
template std::vector<int64_t> build_shuffle_index<int64_t>(int64_t, int64_t, NumpyRandomState&);

// ---------------------------------------------------------------------------------------------

namespace {

int64_t sum_lengths(const LowLevelDataset& data, std::pair<int64_t, int64_t> range) {
  int64_t total = 0;
  for (int64_t i = range.first; i < range.second; ++i) total += data.sequence_length(i);
  return total;
}

int64_t max_length(const LowLevelDataset& data) {
  int64_t m = 0;
  for (int64_t i = 0; i < data.num_sequences(); ++i) m = std::max<int64_t>(m, data.sequence_length(i));
  return m;
}

template <class T>
std::vector<char> as_bytes(const std::vector<T>& values) {
  const char* p = reinterpret_cast<const char*>(values.data());
  return std::vector<char>(p, p + values.size() * sizeof(T));
}

}  // namespace

GptDataset::GptDataset(std::shared_ptr<const LowLevelDataset> data, std::pair<int64_t, int64_t> range,
                       std::optional<int64_t> num_samples, Split split, const GptDatasetConfig& config)
    : data_(std::move(data)), range_(range), num_samples_(num_samples), split_(split), config_(config),
      extra_(config.add_extra_token_to_sequence ? 1 : 0) {
  FP8TRON_CHECK(range.first >= 0 && range.first <= range.second && range.second <= data_->num_sequences(),
                "sequence range outside the dataset");
  if (config_.sequence_length < 2)
    throw UserError(strprintf("--seq-length %lld is too short for a GPT dataset", (long long)config_.sequence_length));
  tokens_per_epoch_ = sum_lengths(*data_, range_);
  if (num_samples_ && *num_samples_ == 0 && tokens_per_epoch_ <= 1) return;  // nothing wanted, nothing there
  if (tokens_per_epoch_ <= 1)
    throw UserError(strprintf("the %s split of %s is empty (sequences [%lld, %lld) hold %lld tokens): adjust "
                              "--split or give more data", split_name(split_), data_->name().c_str(),
                              (long long)range_.first, (long long)range_.second, (long long)tokens_per_epoch_));
  num_epochs_ = gpt_num_epochs(tokens_per_epoch_, num_samples_, config_.sequence_length, extra_);
  if (num_epochs_ > std::numeric_limits<int32_t>::max() ||
      (range_.second - range_.first) * num_epochs_ > std::numeric_limits<int32_t>::max())
    throw UserError(strprintf("the %s split of %s would need %lld epochs of %lld tokens: too many for the "
                              "int32 document index; use more data or fewer samples", split_name(split_),
                              data_->name().c_str(), (long long)num_epochs_, (long long)tokens_per_epoch_));

  const std::string description_text = description();
  cache_.dir = config_.cache_dir.empty() ? data_->default_cache_dir() : config_.cache_dir;
  cache_.base = strprintf("fp8tron-%s-GPTDataset-%s", hash_hex(description_text).c_str(), split_name(split_));
  cache_.description = description_text;
  cache_.suffixes = {"document_index.npy", "sample_index.npy", "shuffle_index.npy"};
  if (cached()) {
    built_ = ensure_cached(cache_, [this](const std::vector<std::string>& paths) {
      auto arrays = build();
      for (size_t i = 0; i < arrays.size(); ++i)
        save_npy(paths[i], arrays[i].type, arrays[i].shape, arrays[i].bytes.data());
    });
    document_index_ = NpyArray(cache_.path("document_index.npy"));
    sample_index_ = NpyArray(cache_.path("sample_index.npy"));
    shuffle_index_ = NpyArray(cache_.path("shuffle_index.npy"));
  } else {
    auto arrays = build();
    built_ = true;
    document_index_ = NpyArray(arrays[0].type, arrays[0].shape, std::move(arrays[0].bytes));
    sample_index_ = NpyArray(arrays[1].type, arrays[1].shape, std::move(arrays[1].bytes));
    shuffle_index_ = NpyArray(arrays[2].type, arrays[2].shape, std::move(arrays[2].bytes));
  }
  if (sample_index_.shape().size() != 2 || sample_index_.shape()[0] < 1 ||
      shuffle_index_.numel() != sample_index_.shape()[0] - 1)
    throw UserError(strprintf("the cached indices %s* are inconsistent: delete them so they are rebuilt",
                              cache_.path("").c_str()));
  size_ = sample_index_.shape()[0] - 1;
}

// Everything the indices depend on; its hash names the cache files. An indexed dataset's .idx
// size and token count make a re-tokenized dataset at the same path miss the cache.
std::string GptDataset::description() const {
  return strprintf(
      "fp8tron GPTDataset indices (format 1)\n"
      "%s"
      "split: %s\nsequence_range: [%lld, %lld)\nnum_samples: %s\nsequence_length: %lld\nrandom_seed: %u\n"
      "add_extra_token_to_sequence: %d\ndrop_last_partial_sequence: %d\n",
      data_->identity().c_str(), split_name(split_), (long long)range_.first, (long long)range_.second,
      num_samples_ ? std::to_string(*num_samples_).c_str() : "None", (long long)config_.sequence_length,
      config_.seed, extra_,
      split_ == Split::Valid ? int(config_.drop_last_partial_validation_sequence) : 1);
}

std::vector<GptDataset::BuiltArray> GptDataset::build() const {
  const int64_t seq = config_.sequence_length;
  const bool separate = num_samples_ && gpt_separate_final_epoch(tokens_per_epoch_, num_epochs_, *num_samples_, seq, extra_);
  NumpyRandomState rng(config_.seed);
  std::vector<BuiltArray> out;
  const auto document_index = build_document_index(range_.first, range_.second, num_epochs_, rng, separate);
  out.push_back({NpyType::Int32, {int64_t(document_index.size())}, as_bytes(document_index)});

  const bool drop_last = split_ == Split::Valid ? config_.drop_last_partial_validation_sequence : true;
  int64_t rows = 0;
  // Megatron stores the sample index as int32 when every value fits (helpers.py).
  if (std::max<int64_t>(int64_t(document_index.size()), max_length(*data_)) <= std::numeric_limits<int32_t>::max()) {
    auto index = build_sample_index<int32_t>(data_->sequence_lengths(), document_index, int32_t(seq),
                                             int32_t(num_epochs_), tokens_per_epoch_, drop_last, extra_);
    rows = int64_t(index.size() / 2);
    out.push_back({NpyType::Int32, {rows, 2}, as_bytes(index)});
  } else {
    auto index = build_sample_index<int64_t>(data_->sequence_lengths(), document_index, int32_t(seq),
                                             int32_t(num_epochs_), tokens_per_epoch_, drop_last, extra_);
    rows = int64_t(index.size() / 2);
    out.push_back({NpyType::Int64, {rows, 2}, as_bytes(index)});
  }

  const int64_t total = rows - 1;
  const int64_t first = separate ? ((num_epochs_ - 1) * tokens_per_epoch_ - extra_) / seq : total;
  if (total >= int64_t(std::numeric_limits<uint32_t>::max()) - 1)
    out.push_back({NpyType::Int64, {total}, as_bytes(build_shuffle_index<int64_t>(first, total, rng))});
  else
    out.push_back({NpyType::UInt32, {total}, as_bytes(build_shuffle_index<uint32_t>(first, total, rng))});
  if (cached())
    std::fprintf(stderr, "built GPTDataset %s indices for %s: %lld samples, %lld epochs\n", split_name(split_),
                 data_->name().c_str(), (long long)total, (long long)num_epochs_);
  return out;
}

void GptDataset::sample(int64_t index, int64_t* out) const {
  FP8TRON_CHECK(index >= 0 && index < size_, strprintf("sample %lld of %lld", (long long)index, (long long)size_));
  const int64_t row = shuffle_index_.at(index);
  const int64_t first_doc = sample_index_.at(2 * row), first_offset = sample_index_.at(2 * row + 1);
  const int64_t last_doc = sample_index_.at(2 * row + 2), last_offset = sample_index_.at(2 * row + 3);
  const int64_t want = sample_length();
  int64_t written = 0;
  for (int64_t d = first_doc; d <= last_doc; ++d) {
    const int64_t sequence = document_index_.at(d);
    const int64_t offset = d == first_doc ? first_offset : 0;
    const int64_t end = d == last_doc ? last_offset + extra_ : data_->sequence_length(sequence);
    const int64_t length = std::min(end - offset, want - written);
    data_->read(sequence, offset, length, out + written);
    written += length;
  }
  std::fill(out + written, out + want, kPadTokenId);
}

std::string GptDataset::token_origin(int64_t index, int64_t position) const {
  if (index < 0 || index >= size_) return "";
  // The walk of sample(), stopping at `position`.
  const int64_t row = shuffle_index_.at(index);
  const int64_t first_doc = sample_index_.at(2 * row), first_offset = sample_index_.at(2 * row + 1);
  const int64_t last_doc = sample_index_.at(2 * row + 2), last_offset = sample_index_.at(2 * row + 3);
  int64_t written = 0;
  for (int64_t d = first_doc; d <= last_doc && written < sample_length(); ++d) {
    const int64_t sequence = document_index_.at(d);
    const int64_t offset = d == first_doc ? first_offset : 0;
    const int64_t end = d == last_doc ? last_offset + extra_ : data_->sequence_length(sequence);
    const int64_t length = std::min(end - offset, sample_length() - written);
    if (position < written + length) return data_->origin(sequence, offset + position - written);
    written += length;
  }
  return "";
}

}  // namespace fp8tron::data
