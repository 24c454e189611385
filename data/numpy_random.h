// numpy.random.RandomState, reduced to what Megatron's dataset code calls: RandomState(seed),
// RandomState([k0, k1, ...]), shuffle() of a 1-D array, binomial(1, p) and randint(0, n + 1).
// Megatron builds its document and shuffle indices and its fill-in-the-middle draws with these, so
// the same seed gives byte-identical indices and draws here and in Megatron.
//
// RandomState(int seed) seeds MT19937 with the classic init_genrand(seed), exactly what
// std::mt19937(seed) does; an array seed goes through MT19937's init_by_array. shuffle() is a
// Fisher-Yates pass from the last element down, drawing each j in [0, i] with numpy's legacy
// "masked rejection" sampler (random_interval): take the smallest all-ones mask covering i, draw
// 32-bit words (64-bit for i >= 2^32) until one masked value is <= i. randint(low, high, size=k)
// draws its k values with the same sampler.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <utility>
#include <vector>

namespace fp8tron::data {

class NumpyRandomState {
 public:
  explicit NumpyRandomState(uint32_t seed) : mt_(seed) {}
  // RandomState(numpy.array(key, dtype=uint32)): MT19937's init_by_array.
  explicit NumpyRandomState(const std::vector<uint32_t>& key) {
    InitByArray init{key};
    mt_.seed(init);
  }

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

  // random_sample(): 53 random bits from two words (numpy's mt19937_next_double).
  double next_double() {
    const uint32_t a = next_uint32() >> 5, b = next_uint32() >> 6;
    return (double(a) * 67108864.0 + double(b)) / 9007199254740992.0;
  }

  // RandomState.binomial(1, p) for 0 <= p <= 1, draw for draw: the legacy sampler's inversion
  // branch (taken for n * min(p, 1 - p) <= 30), which draws one double even when p is 0 or 1
  // (legacy RandomState has no shortcut for p == 0), and one more on the rare rejection.
  int64_t binomial_one(double p) {
    const bool flip = p > 0.5;
    const double r = flip ? 1.0 - p : p, q = 1.0 - r;
    const double qn = std::exp(std::log(q));  // q^n for n = 1, rounded as numpy rounds it
    const int64_t bound = std::min<int64_t>(1, int64_t(r + 10.0 * std::sqrt(r * q + 1)));
    int64_t x = 0;
    double px = qn, u = next_double();
    while (u > px) {
      if (++x > bound) {
        x = 0;
        px = qn;
        u = next_double();
      } else {
        u -= px;
        px = (double(1 - x + 1) * r) / (double(x) * q);
      }
    }
    return flip ? 1 - x : x;
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
  // A seed sequence whose generate() writes numpy's init_by_array state: std::mt19937 takes the
  // 624 words as they are and starts with a twist, as numpy does (its position is 624 too).
  struct InitByArray {
    using result_type = uint32_t;
    const std::vector<uint32_t>& key;
    template <class It>
    void generate(It begin, It end) const {
      constexpr int n = 624;
      uint32_t mt[n];
      mt[0] = 19650218u;
      for (int i = 1; i < n; ++i) mt[i] = 1812433253u * (mt[i - 1] ^ (mt[i - 1] >> 30)) + uint32_t(i);
      const int length = int(key.size());
      int i = 1, j = 0;
      for (int k = std::max(n, length); k > 0; --k) {
        mt[i] = (mt[i] ^ ((mt[i - 1] ^ (mt[i - 1] >> 30)) * 1664525u)) + key[size_t(j)] + uint32_t(j);
        if (++i >= n) {
          mt[0] = mt[n - 1];
          i = 1;
        }
        if (++j >= length) j = 0;
      }
      for (int k = n - 1; k > 0; --k) {
        mt[i] = (mt[i] ^ ((mt[i - 1] ^ (mt[i - 1] >> 30)) * 1566083941u)) - uint32_t(i);
        if (++i >= n) {
          mt[0] = mt[n - 1];
          i = 1;
        }
      }
      mt[0] = 0x80000000u;  // most significant bit set: a non-zero state
      for (int w = 0; begin != end && w < n; ++begin, ++w) *begin = mt[w];
    }
  };

  std::mt19937 mt_;
};

}  // namespace fp8tron::data
