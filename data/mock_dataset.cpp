#include "data/mock_dataset.h"

#include "core/error.h"
#include "core/text.h"
#include "data/numpy_generator.h"

namespace fp8tron::data {

MockLowLevelDataset::MockLowLevelDataset(int64_t vocab_size, int64_t eod)
    : vocab_size_(vocab_size), eod_(eod),
      lengths_(NumpyGenerator(kSeed).integers_int32(1, kMaxLength, kDocuments)),
      lengths_view_(reinterpret_cast<const char*>(lengths_.data()), int64_t(lengths_.size())) {
  if (vocab_size <= 0) throw UserError("--mock-data needs a vocabulary: pass --vocab-size or a tokenizer");
}

void MockLowLevelDataset::read(int64_t sequence, int64_t offset, int64_t length, int64_t* out) const {
  const int64_t n = lengths_[size_t(sequence)];
  FP8TRON_CHECK(offset >= 0 && length >= 0 && offset + length <= n, "tokens past the end of a mock document");
  for (int64_t i = 0; i < length; ++i) {
    const int64_t position = offset + i;
    out[i] = position == n - 1 ? eod_ : (position + 1) % vocab_size_;
  }
}

std::string MockLowLevelDataset::identity() const {
  return strprintf("dataset: MockGPTLowLevelDataset\nvocab_size: %lld\neod: %lld\n", (long long)vocab_size_,
                   (long long)eod_);
}

std::string MockLowLevelDataset::origin(int64_t sequence, int64_t token) const {
  return strprintf("Megatron's mock dataset, document %lld, token %lld of it", (long long)sequence, (long long)token);
}

}  // namespace fp8tron::data
