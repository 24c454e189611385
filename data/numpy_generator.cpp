#include "data/numpy_generator.h"

#include "core/error.h"

namespace fp8tron::data {
namespace {

// SeedSequence's hashing constants (numpy/random/bit_generator.pyx).
constexpr uint32_t kInitA = 0x43b0d7e5, kMultA = 0x931e8875;
constexpr uint32_t kInitB = 0x8b51f9dd, kMultB = 0x58f38ded;
constexpr uint32_t kMixMultL = 0xca01f9dd, kMixMultR = 0x4973f715;
constexpr int kPoolSize = 4;

uint32_t hashmix(uint32_t value, uint32_t& hash_const) {
  value ^= hash_const;
  hash_const *= kMultA;
  value *= hash_const;
  return value ^ (value >> 16);
}

uint32_t mix(uint32_t x, uint32_t y) {
  const uint32_t result = kMixMultL * x - kMixMultR * y;
  return result ^ (result >> 16);
}

// The seed as 32-bit words, least significant first; 0 is one zero word.
std::vector<uint32_t> seed_words(uint64_t seed) {
  std::vector<uint32_t> words;
  if (seed == 0) words.push_back(0);
  for (; seed > 0; seed >>= 32) words.push_back(uint32_t(seed));
  return words;
}

// SeedSequence.mix_entropy: the pool every generated word is drawn from.
std::vector<uint32_t> entropy_pool(uint64_t seed) {
  const std::vector<uint32_t> entropy = seed_words(seed);
  std::vector<uint32_t> pool(kPoolSize);
  uint32_t hash_const = kInitA;
  for (size_t i = 0; i < pool.size(); ++i) pool[i] = hashmix(i < entropy.size() ? entropy[i] : 0, hash_const);
  for (size_t src = 0; src < pool.size(); ++src)
    for (size_t dst = 0; dst < pool.size(); ++dst)
      if (src != dst) pool[dst] = mix(pool[dst], hashmix(pool[src], hash_const));
  for (size_t src = pool.size(); src < entropy.size(); ++src)
    for (size_t dst = 0; dst < pool.size(); ++dst) pool[dst] = mix(pool[dst], hashmix(entropy[src], hash_const));
  return pool;
}

unsigned __int128 u128(uint64_t high, uint64_t low) { return (unsigned __int128)high << 64 | low; }

const unsigned __int128 kPcgMultiplier = u128(2549297995355413924ULL, 4865540595714422341ULL);

}  // namespace

std::vector<uint32_t> seed_sequence_state(uint64_t seed, int words) {
  const std::vector<uint32_t> pool = entropy_pool(seed);
  std::vector<uint32_t> state(static_cast<size_t>(words));
  uint32_t hash_const = kInitB;
  for (size_t i = 0; i < state.size(); ++i) {
    uint32_t value = pool[i % pool.size()];
    value ^= hash_const;
    hash_const *= kMultB;
    value *= hash_const;
    state[i] = value ^ (value >> 16);
  }
  return state;
}

NumpyGenerator::NumpyGenerator(uint64_t seed) {
  // generate_state(4, uint64): pairs of words, low word first; words 0-1 seed the state (the
  // first 64-bit value is its high half), words 2-3 the stream.
  const std::vector<uint32_t> w = seed_sequence_state(seed, 8);
  auto word64 = [&](int i) { return uint64_t(w[size_t(2 * i)]) | uint64_t(w[size_t(2 * i + 1)]) << 32; };
  const unsigned __int128 initial_state = u128(word64(0), word64(1));
  const unsigned __int128 sequence = u128(word64(2), word64(3));
  // pcg_setseq_128_srandom_r
  increment_ = sequence << 1 | 1;
  state_ = 0;
  state_ = state_ * kPcgMultiplier + increment_;
  state_ += initial_state;
  state_ = state_ * kPcgMultiplier + increment_;
}

uint64_t NumpyGenerator::next_uint64() {
  state_ = state_ * kPcgMultiplier + increment_;
  // XSL-RR: xor of the halves, rotated right by the top six bits.
  const uint64_t folded = uint64_t(state_ >> 64) ^ uint64_t(state_);
  const unsigned rotation = unsigned(state_ >> 122);
  return (folded >> rotation) | (folded << ((64 - rotation) & 63));
}

uint32_t NumpyGenerator::next_uint32() {
  if (has_half_) {
    has_half_ = false;
    return half_;
  }
  const uint64_t draw = next_uint64();
  has_half_ = true;
  half_ = uint32_t(draw >> 32);
  return uint32_t(draw);
}

std::vector<int32_t> NumpyGenerator::integers_int32(int32_t low, int32_t high, int64_t count) {
  FP8TRON_CHECK(low < high && count >= 0, "integers_int32 needs low < high");
  const uint32_t range = uint32_t(int64_t(high) - 1 - low);  // inclusive span, as numpy passes it
  std::vector<int32_t> out(static_cast<size_t>(count));
  for (auto& value : out) {
    uint32_t draw = 0;
    if (range == 0xFFFFFFFFu) {
      draw = next_uint32();
    } else if (range > 0) {
      // Lemire's bounded draw: the high word of a 32x32 product, rejecting the biased low words.
      const uint32_t span = range + 1;
      uint64_t product = uint64_t(next_uint32()) * span;
      if (uint32_t(product) < span) {
        const uint32_t threshold = (0xFFFFFFFFu - range) % span;
        while (uint32_t(product) < threshold) product = uint64_t(next_uint32()) * span;
      }
      draw = uint32_t(product >> 32);
    }
    value = int32_t(uint32_t(low) + draw);
  }
  return out;
}

}  // namespace fp8tron::data
