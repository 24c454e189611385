// numpy.random.RandomState, reduced to what Megatron's dataset code calls: RandomState(seed) and
// shuffle() of a 1-D array. Megatron builds its document and shuffle indices with these, so the
// same seed gives byte-identical indices here and in Megatron.
//
// RandomState(int seed) seeds MT19937 with the classic init_genrand(seed), exactly what
// std::mt19937(seed) does. shuffle() is a Fisher-Yates pass from the last element down, drawing
// each j in [0, i] with numpy's legacy "masked rejection" sampler (random_interval): take the
// smallest all-ones mask covering i, draw 32-bit words (64-bit for i >= 2^32) until one masked
// value is <= i.
#pragma once
#include <cstdint>
#include <random>
#include <utility>

namespace fp8tron::data {

class NumpyRandomState {
 public:
  explicit NumpyRandomState(uint32_t seed) : mt_(seed) {}

  uint32_t next_uint32() { return uint32_t(mt_()); }
  // numpy's mt19937_next64: the first draw is the high word.
  uint64_t next_uint64() {
    const uint64_t high = next_uint32();
    return high << 32 | next_uint32();
  }

  // A uniform integer in [0, max] (numpy's random_interval).
  uint64_t random_interval(uint64_t max) {
    if (max == 0) return 0;
    uint64_t mask = max;
    for (int shift = 1; shift <= 32; shift *= 2) mask |= mask >> shift;
    uint64_t value;
    if (max <= 0xffffffffULL) {
      while ((value = (next_uint32() & mask)) > max) {}
    } else {
      while ((value = (next_uint64() & mask)) > max) {}
    }
    return value;
  }

  // RandomState.shuffle on a 1-D array of n elements.
  template <class T>
  void shuffle(T* data, int64_t n) {
    for (int64_t i = n - 1; i >= 1; --i) {
      const int64_t j = int64_t(random_interval(uint64_t(i)));
      std::swap(data[i], data[j]);
    }
  }

 private:
  std::mt19937 mt_;
};

}  // namespace fp8tron::data
