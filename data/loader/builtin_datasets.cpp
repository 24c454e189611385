#include "data/loader/builtin_datasets.h"

#include <algorithm>
#include <cmath>
#include <mutex>

namespace fp8tron {
namespace {

// splitmix64: a tiny, well-mixed counter-based generator, so any sample is computed directly.
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}
uint64_t hash3(uint64_t a, uint64_t b, uint64_t c) { return mix(mix(mix(a) ^ b) ^ c); }

class MockSource : public SampleSource {
 public:
  MockSource(int64_t seq_length, int64_t vocab_size, int64_t eod, uint64_t seed)
      : seq_(seq_length), vocab_(vocab_size), eod_(eod), seed_(seed) {}

  void sample(Split split, int64_t index, int64_t* out) const override {
    // Each split is its own stream of documents; sample i covers stream tokens [i*s, i*s + s].
    const int64_t start = index * seq_;
    std::lock_guard<std::mutex> lock(mutex_);
    auto& starts = doc_starts_[int(split)];
    extend(split, start + seq_ + 1);
    auto it = std::upper_bound(starts.begin(), starts.end(), start);
    size_t doc = size_t(it - starts.begin()) - 1;
    for (int64_t i = 0; i <= seq_; ++i) {
      const int64_t pos = start + i;
      while (starts[doc + 1] <= pos) ++doc;
      const int64_t offset = pos - starts[doc], length = starts[doc + 1] - starts[doc];
      // Tokens (1..length-1) mod vocab, then the tokenizer's end-of-document id (as Megatron's
      // MockGPTLowLevelDataset).
      out[i] = offset == length - 1 ? eod_ : (offset + 1) % vocab_;
    }
  }

 private:
  void extend(Split split, int64_t needed) const {
    auto& starts = doc_starts_[int(split)];
    if (starts.empty()) starts.push_back(0);
    while (starts.back() < needed + 1) {
      const uint64_t doc = starts.size() - 1;
      const int64_t length = 1 + int64_t(hash3(seed_, uint64_t(split) + 1, doc) % 4095);
      starts.push_back(starts.back() + length);
    }
  }
  int64_t seq_, vocab_, eod_;
  uint64_t seed_;
  mutable std::mutex mutex_;
  mutable std::vector<int64_t> doc_starts_[3];
};

constexpr double kSuccessorProbs[4] = {0.55, 0.25, 0.15, 0.05};

class BuiltinSource : public SampleSource {
 public:
  BuiltinSource(int64_t seq_length, int64_t vocab_size, uint64_t seed)
      : seq_(seq_length), active_(std::min<int64_t>(vocab_size - 1, 1024)), seed_(seed) {}

  void sample(Split split, int64_t index, int64_t* out) const override {
    uint64_t state = hash3(seed_ ^ 0x5eedULL, uint64_t(split) + 1, uint64_t(index));
    out[0] = int64_t(mix(state) % uint64_t(active_));
    for (int64_t i = 1; i <= seq_; ++i) {
      state = mix(state);
      const double u = double(state >> 11) * 0x1.0p-53;
      int choice = 0;
      for (double acc = kSuccessorProbs[0]; choice < 3 && u >= acc; acc += kSuccessorProbs[++choice]) {
      }
      out[i] = successor(out[i - 1], choice);
    }
  }

 private:
  int64_t successor(int64_t token, int choice) const {
    return int64_t(hash3(seed_, uint64_t(token), uint64_t(choice)) % uint64_t(active_));
  }
  int64_t seq_, active_;
  uint64_t seed_;
};

}  // namespace

std::unique_ptr<SampleSource> make_mock_source(int64_t seq_length, int64_t vocab_size, int64_t eod, uint64_t seed) {
  return std::make_unique<MockSource>(seq_length, vocab_size, eod, seed);
}
std::unique_ptr<SampleSource> make_builtin_source(int64_t seq_length, int64_t vocab_size, uint64_t seed) {
  return std::make_unique<BuiltinSource>(seq_length, vocab_size, seed);
}

double builtin_source_entropy() {
  double h = 0;
  for (double p : kSuccessorProbs) h -= p * std::log(p);
  return h;
}

}  // namespace fp8tron
