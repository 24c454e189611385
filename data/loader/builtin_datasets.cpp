#include "data/loader/builtin_datasets.h"

#include <algorithm>
#include <cmath>

#include "data/dataset_builder.h"
#include "data/loader/split_datasets_source.h"
#include "data/mock_dataset.h"

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

std::unique_ptr<SampleSource> make_mock_source(int64_t seq_length, int64_t vocab_size, int64_t eod, uint64_t seed,
                                               const std::array<std::optional<int64_t>, 3>& samples) {
  data::GptDatasetsConfig config;
  config.mock = std::make_shared<const data::MockLowLevelDataset>(vocab_size, eod);
  config.sizes = samples;
  config.gpt.sequence_length = seq_length;
  config.gpt.seed = uint32_t(seed);
  return make_split_datasets_source(data::build_gpt_datasets(config));
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
