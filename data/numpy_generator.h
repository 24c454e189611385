// numpy.random.default_rng(seed), reduced to what Megatron's mock dataset calls: the PCG64 bit
// generator seeded through SeedSequence, and Generator.integers(low, high, dtype=int32).
// MockGPTLowLevelDataset draws its document lengths with it, so the same seed gives the same
// lengths here as in Megatron (numpy_random.h is the legacy RandomState, a different generator).
//
//   SeedSequence(seed)   hashes the seed's 32-bit words into a pool of four words and expands the
//                        pool into the 128-bit state and increment of PCG64
//   PCG64                a 128-bit LCG whose output is the XSL-RR permutation of the new state;
//                        32-bit draws use the low half of a 64-bit draw, then its high half
//   integers(lo, hi)     Lemire's multiply-shift with rejection over [lo, hi) (int32 draws)
#pragma once
#include <cstdint>
#include <vector>

namespace fp8tron::data {

class NumpyGenerator {
 public:
  // numpy.random.default_rng(seed) for a non-negative seed below 2^64.
  explicit NumpyGenerator(uint64_t seed);

  uint64_t next_uint64();
  uint32_t next_uint32();

  // Generator.integers(low, high, size=count, dtype=numpy.int32): count values in [low, high).
  std::vector<int32_t> integers_int32(int32_t low, int32_t high, int64_t count);

 private:
  unsigned __int128 state_ = 0, increment_ = 0;
  bool has_half_ = false;  // the high half of the last 64-bit draw is still unused
  uint32_t half_ = 0;
};

// SeedSequence(seed).generate_state(words, numpy.uint32): the words PCG64 is seeded from.
std::vector<uint32_t> seed_sequence_state(uint64_t seed, int words);

}  // namespace fp8tron::data
