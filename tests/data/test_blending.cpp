#include <gtest/gtest.h>

#include <cmath>

#include "data/blended_dataset.h"
#include "data/data_spec.h"
#include "data/dataset_builder.h"
#include "data/indexed_dataset.h"
#include "test_util.h"

namespace fp8tron::data {
namespace {

using testing::ScratchDir;

std::vector<int64_t> blend(const std::vector<double>& w, int64_t size, std::vector<int64_t>* sample_index = nullptr) {
  std::vector<int16_t> d(static_cast<size_t>(size));
  std::vector<int64_t> s(static_cast<size_t>(size));
  build_blending_indices(w, size, d.data(), s.data());
  if (sample_index) *sample_index = s;
  return {d.begin(), d.end()};
}

// Golden values from Megatron's helpers.cpp build_blending_indices / build_exhaustive_...
TEST(Blending, MatchesMegatron) {
  std::vector<int64_t> samples;
  EXPECT_EQ(blend({0.3, 0.7}, 10, &samples), (std::vector<int64_t>{1, 0, 1, 1, 0, 1, 1, 0, 1, 1}));
  EXPECT_EQ(samples, (std::vector<int64_t>{0, 0, 1, 2, 1, 3, 4, 2, 5, 6}));
  EXPECT_EQ(blend({0.5, 0.25, 0.25}, 8, &samples), (std::vector<int64_t>{0, 1, 2, 0, 0, 1, 2, 0}));
  EXPECT_EQ(samples, (std::vector<int64_t>{0, 0, 0, 1, 2, 1, 1, 3}));
  std::vector<int16_t> d(6);
  std::vector<int64_t> s(6);
  build_exhaustive_blending_indices({3, 1, 2}, d.data(), s.data());
  EXPECT_EQ(std::vector<int64_t>(d.begin(), d.end()), (std::vector<int64_t>{0, 2, 1, 0, 2, 0}));
  EXPECT_EQ(s, (std::vector<int64_t>{0, 0, 0, 1, 1, 2}));
}

// The greedy rule keeps every prefix within about one sample of its target.
TEST(Blending, EveryPrefixFollowsTheWeights) {
  const std::vector<double> w = normalize({0.2, 0.5, 0.05, 0.25});
  const auto d = blend(w, 20000);
  std::vector<int64_t> count(4, 0);
  for (size_t i = 0; i < d.size(); ++i) {
    ++count[size_t(d[i])];
    for (size_t k = 0; k < 4; ++k) ASSERT_LE(std::abs(double(count[k]) - w[k] * double(i + 1)), 2.0) << "prefix " << i;
  }
}

TEST(Blending, ExhaustiveDrawsEverySampleOnce) {
  const std::vector<int64_t> sizes = {17, 3, 40};
  std::vector<int16_t> d(60);
  std::vector<int64_t> s(60);
  build_exhaustive_blending_indices(sizes, d.data(), s.data());
  for (int k = 0; k < 3; ++k) {
    std::vector<int64_t> got;
    for (int i = 0; i < 60; ++i)
      if (d[size_t(i)] == k) got.push_back(s[size_t(i)]);
    ASSERT_EQ(int64_t(got.size()), sizes[size_t(k)]);
    for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i], int64_t(i));
  }
}

TEST(DataSpec, ParseBlend) {
  Blend b = parse_blend({"0.3", "a", "0.7", "b"});
  EXPECT_EQ(b.prefixes, (std::vector<std::string>{"a", "b"}));
  ASSERT_TRUE(b.weights);
  EXPECT_EQ(*b.weights, (std::vector<double>{0.3, 0.7}));
  b = parse_blend({"a", "b"});
  EXPECT_EQ(b.prefixes, (std::vector<std::string>{"a", "b"}));
  EXPECT_FALSE(b.weights);
  b = parse_blend({"data/x_text_document"});
  EXPECT_FALSE(b.weights);
  b = parse_blend({"30", " a ", "70", "b"});
  EXPECT_EQ(b.prefixes[0], "a");
  EXPECT_EQ((*b.weights)[1], 70.0);
  EXPECT_USER_ERROR(parse_blend({"0.3", "a", "b", "c"}), "mixes weights");
  EXPECT_USER_ERROR(parse_blend({"0", "a", "1", "b"}), "positive");
  EXPECT_USER_ERROR(parse_blend({}), "--data-path");
}

TEST(DataSpec, SplitParsingAndRanges) {
  const auto f = parse_split("969, 30, 1");
  EXPECT_DOUBLE_EQ(f[0], 0.969);
  EXPECT_DOUBLE_EQ(f[2], 0.001);
  EXPECT_EQ(parse_split("8,2"), (std::vector<double>{0.8, 0.2, 0.0}));
  const auto m = split_matrix(f);
  ASSERT_TRUE(m[0] && m[1] && m[2]);
  EXPECT_EQ(sequence_range(*m[0], 1000), (std::pair<int64_t, int64_t>{0, 969}));
  EXPECT_EQ(sequence_range(*m[1], 1000), (std::pair<int64_t, int64_t>{969, 999}));
  EXPECT_EQ(sequence_range(*m[2], 1000), (std::pair<int64_t, int64_t>{999, 1000}));
  const auto m2 = split_matrix(parse_split("100,0,0"));
  EXPECT_TRUE(m2[0]);
  EXPECT_FALSE(m2[1]);
  EXPECT_FALSE(m2[2]);
  // Python's round() rounds half to even: 0.5 * 5 = 2.5 -> 2, 0.5 * 7 = 3.5 -> 4.
  EXPECT_EQ(sequence_range({0.0, 0.5}, 5).second, 2);
  EXPECT_EQ(sequence_range({0.0, 0.5}, 7).second, 4);
  EXPECT_USER_ERROR(parse_split("1,2,3,4"), "at most three");
  EXPECT_USER_ERROR(parse_split("0,0,0"), "--split");
}

TEST(DataSpec, NumpySummationAndMargin) {
  // numpy sums float64 pairwise: for 9+ values the order differs from a plain loop.
  std::vector<double> v;
  for (int i = 0; i < 20; ++i) v.push_back(0.1 * (i + 1) + 1e-17 * i);
  double loop = 0;
  for (double x : v) loop += x;
  EXPECT_NEAR(numpy_sum(v), loop, 1e-12);
  EXPECT_EQ(samples_per_dataset({0.3, 0.7}, 1000, 0.005), (std::vector<int64_t>{302, 704}));
  EXPECT_EQ(samples_per_dataset({0.3, 0.7}, 1000, 0.0), (std::vector<int64_t>{300, 700}));
}

// --data-path 0.3 A 0.7 B: per-dataset samples carry a 0.5% margin, the blend has exactly the
// targets, and its composition follows the weights.
TEST(BlendedBuilder, WeightedBlendFollowsWeights) {
  ScratchDir dir;
  for (const char* name : {"a", "b"}) {
    IndexedDatasetBuilder b(dir / (std::string(name) + ".bin"), DType::Int32);
    for (int d = 0; d < 300; ++d) {
      std::vector<int64_t> t(size_t(5 + d % 40), name[0] == 'a' ? 1 : 2);
      b.add_document(t.data(), int64_t(t.size()), {int32_t(t.size())});
    }
    b.finalize(dir / (std::string(name) + ".idx"));
  }
  GptDatasetsConfig c;
  c.blend = parse_blend({"0.3", dir / "a", "0.7", dir / "b"});
  c.split = "98,2,0";
  c.sizes = {2000, 50, 0};
  c.gpt.sequence_length = 16;
  c.gpt.cache_dir = dir / "cache";
  const auto splits = build_gpt_datasets(c);
  ASSERT_TRUE(splits[0] && splits[1]);
  EXPECT_FALSE(splits[2]);
  EXPECT_EQ(splits[0]->size(), 2000);
  const auto* blended = dynamic_cast<const BlendedDataset*>(splits[0].get());
  ASSERT_NE(blended, nullptr);
  int64_t from_a = 0;
  std::vector<int64_t> s(17);
  for (int64_t i = 0; i < 2000; ++i) {
    splits[0]->sample(i, s.data());
    const bool a = s[0] == 1;
    EXPECT_EQ(a, blended->dataset_of(i) == 0);
    from_a += a;
  }
  EXPECT_EQ(from_a, 600);
  // A second run loads the blend from the cache and gives the same samples.
  const auto again = build_gpt_datasets(c);
  std::vector<int64_t> t(17);
  for (int64_t i = 0; i < 2000; i += 97) {
    splits[0]->sample(i, s.data());
    again[0]->sample(i, t.data());
    EXPECT_EQ(s, t);
  }
}

TEST(BlendedBuilder, WeightsNeedASize) {
  ScratchDir dir;
  IndexedDatasetBuilder b(dir / "a.bin", DType::Int32);
  std::vector<int64_t> t(50, 3);
  b.add_document(t.data(), 50, {50});
  b.finalize(dir / "a.idx");
  GptDatasetsConfig c;
  c.blend = parse_blend({"1", dir / "a", "1", dir / "a"});
  c.split = "100,0,0";
  c.gpt.sequence_length = 8;
  c.gpt.cache_dir = dir / "cache";
  EXPECT_USER_ERROR(build_gpt_datasets(c), "weights", "sample count");
}

}  // namespace
}  // namespace fp8tron::data
