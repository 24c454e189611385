#include <gtest/gtest.h>

#include <numeric>

#include "data/npy_file.h"
#include "data/numpy_generator.h"
#include "data/numpy_random.h"
#include "test_util.h"

namespace fp8tron::data {
namespace {

std::vector<int64_t> shuffled(NumpyRandomState& rng, int64_t n) {
  std::vector<int64_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), 0);
  rng.shuffle(v.data(), n);
  return v;
}

// Golden values from numpy 2.4: np.random.RandomState(seed).shuffle(np.arange(n)).
TEST(NumpyRandomState, ShuffleMatchesNumpy) {
  NumpyRandomState a(1234);
  EXPECT_EQ(shuffled(a, 10), (std::vector<int64_t>{7, 2, 9, 1, 0, 8, 4, 5, 6, 3}));
  NumpyRandomState b(0);  // the state carries over between calls
  EXPECT_EQ(shuffled(b, 20), (std::vector<int64_t>{18, 1, 19, 8, 10, 17, 6, 13, 4, 2, 5, 14, 9, 7, 16, 11, 3, 0, 15, 12}));
  EXPECT_EQ(shuffled(b, 7), (std::vector<int64_t>{5, 2, 3, 4, 1, 0, 6}));
  NumpyRandomState c(5);
  EXPECT_EQ(shuffled(c, 1), std::vector<int64_t>{0});
  EXPECT_EQ(shuffled(c, 0), std::vector<int64_t>{});
}

TEST(NumpyRandomState, IntervalIsUniform) {
  NumpyRandomState rng(42);
  std::vector<int> hist(5, 0);
  for (int i = 0; i < 50000; ++i) ++hist[size_t(rng.random_interval(4))];
  for (int h : hist) EXPECT_NEAR(h, 10000, 400);
  EXPECT_EQ(rng.random_interval(0), 0u);
}

// Golden values from numpy 2.4: SeedSequence(0).generate_state(4, numpy.uint64) and
// default_rng(0).integers(1, 4096, size=100000, dtype=numpy.int32) (Megatron's mock lengths).
TEST(NumpyGenerator, MatchesDefaultRng) {
  const auto words = seed_sequence_state(0, 8);
  auto word64 = [&](int i) { return uint64_t(words[size_t(2 * i)]) | uint64_t(words[size_t(2 * i + 1)]) << 32; };
  EXPECT_EQ(word64(0), 15793235383387715774ULL);
  EXPECT_EQ(word64(1), 12390638538380655177ULL);
  EXPECT_EQ(word64(2), 2361836109651742017ULL);
  EXPECT_EQ(word64(3), 3188717715514472916ULL);

  const auto lengths = NumpyGenerator(0).integers_int32(1, 4096, 100000);
  EXPECT_EQ(std::vector<int32_t>(lengths.begin(), lengths.begin() + 10),
            (std::vector<int32_t>{3484, 2609, 2094, 1105, 1261, 168, 309, 68, 718, 3331}));
  EXPECT_EQ(std::vector<int32_t>(lengths.end() - 5, lengths.end()), (std::vector<int32_t>{2815, 2592, 61, 100, 769}));
  EXPECT_EQ(std::accumulate(lengths.begin(), lengths.end(), int64_t(0)), 204637097);
}

// numpy.save's exact header for a 1-D int32 array of 5 elements and a [10, 2] int64 array.
TEST(Npy, HeaderMatchesNumpySave) {
  testing::ScratchDir dir;
  const std::vector<int32_t> a = {1, 2, 3, 4, 5};
  save_npy(dir / "a.npy", NpyType::Int32, {5}, a.data());
  std::string expected = std::string("\x93NUMPY\x01\x00\x76\x00", 10) +
                         "{'descr': '<i4', 'fortran_order': False, 'shape': (5,), }";
  expected += std::string(128 - 1 - expected.size(), ' ') + "\n";
  const std::string bytes = testing::read_file(dir / "a.npy");
  EXPECT_EQ(bytes.substr(0, 128), expected);
  EXPECT_EQ(bytes.size(), 128u + 20u);

  std::vector<int64_t> b(20);
  std::iota(b.begin(), b.end(), 100);
  save_npy(dir / "b.npy", NpyType::Int64, {10, 2}, b.data());
  NpyArray r(dir / "b.npy");
  EXPECT_EQ(r.shape(), (std::vector<int64_t>{10, 2}));
  EXPECT_EQ(r.type(), NpyType::Int64);
  EXPECT_EQ(r.at(19), 119);
  EXPECT_NE(testing::read_file(dir / "b.npy").find("'shape': (10, 2), }"), std::string::npos);
}

TEST(Npy, RejectsDamagedFiles) {
  testing::ScratchDir dir;
  const std::vector<uint32_t> a = {1, 2, 3};
  save_npy(dir / "a.npy", NpyType::UInt32, {3}, a.data());
  std::string bytes = testing::read_file(dir / "a.npy");
  testing::write_file(dir / "short.npy", bytes.substr(0, bytes.size() - 1));
  EXPECT_USER_ERROR(NpyArray(dir / "short.npy"), "short.npy", "delete it");
  testing::write_file(dir / "junk.npy", "hello");
  EXPECT_USER_ERROR(NpyArray(dir / "junk.npy"), "junk.npy");
}

}  // namespace
}  // namespace fp8tron::data
