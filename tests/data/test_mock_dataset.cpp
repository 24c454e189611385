// Megatron's mock data (--mock-data): MockGPTLowLevelDataset's documents sampled by the GPT
// dataset with the split 1,1,1. Golden samples from Megatron's index functions run with numpy
// 2.4 for --seed 1234, --seq-length 64 and a NullTokenizer of 1024 ids (eod 1023).
#include <gtest/gtest.h>

#include <filesystem>
#include <numeric>

#include "data/dataset_builder.h"
#include "data/mock_dataset.h"
#include "test_util.h"

namespace fp8tron::data {
namespace {

SplitDatasets mock_datasets(int64_t train_samples) {
  GptDatasetsConfig config;
  config.mock = std::make_shared<const MockLowLevelDataset>(1024, 1023);
  config.sizes = {train_samples, 0, 0};
  config.gpt.sequence_length = 64;
  config.gpt.seed = 1234;
  return build_gpt_datasets(config);
}

std::vector<int64_t> sample(const SampleDataset& d, int64_t index) {
  std::vector<int64_t> out(static_cast<size_t>(d.sample_length()));
  d.sample(index, out.data());
  return out;
}

std::vector<int64_t> counting(int64_t first, int64_t count) {
  std::vector<int64_t> out(static_cast<size_t>(count));
  std::iota(out.begin(), out.end(), first);
  return out;
}

template <class... Parts>
std::vector<int64_t> concat(Parts... parts) {
  std::vector<int64_t> out;
  (out.insert(out.end(), parts.begin(), parts.end()), ...);
  return out;
}

TEST(MockDataset, DocumentsCountToTheirEndOfDocument) {
  MockLowLevelDataset mock(1024, 1023);
  EXPECT_EQ(mock.num_sequences(), 100000);
  EXPECT_EQ(mock.sequence_length(0), 3484);
  std::vector<int64_t> tail(4);
  mock.read(0, 3480, 4, tail.data());
  // 3481 .. 3483 modulo 1024, then the end of the document.
  EXPECT_EQ(tail, (std::vector<int64_t>{409, 410, 411, 1023}));
}

TEST(MockDataset, SamplesAreMegatrons) {
  const SplitDatasets splits = mock_datasets(112);
  ASSERT_TRUE(splits[0] && splits[1] && splits[2]);
  const SampleDataset& train = *splits[0];
  // One epoch of the first third of the documents: 68190290 tokens, (68190290 - 1) / 64 samples.
  EXPECT_EQ(train.size(), 1065473);
  EXPECT_EQ(sample(train, 0), counting(649, 65));
  EXPECT_EQ(sample(train, 80), counting(384, 65));
  EXPECT_EQ(sample(train, 111), counting(636, 65));
  // Across a document's end, and across the vocabulary's wrap.
  EXPECT_EQ(sample(train, 2), concat(counting(907, 56), std::vector<int64_t>{1023}, counting(1, 8)));
  EXPECT_EQ(sample(train, 34), concat(counting(1004, 20), counting(0, 45)));
  EXPECT_NE(train.token_origin(2, 56).find("mock dataset, document"), std::string::npos);
}

TEST(MockDataset, IndicesStayInMemory) {
  const auto before = std::filesystem::current_path();
  const SplitDatasets splits = mock_datasets(8);
  EXPECT_FALSE(dynamic_cast<const GptDataset&>(*splits[0]).cached());
  EXPECT_TRUE(dynamic_cast<const GptDataset&>(*splits[0]).built_indices());
  EXPECT_FALSE(std::filesystem::exists(before / "cache"));
}

}  // namespace
}  // namespace fp8tron::data
