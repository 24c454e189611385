#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <thread>

#include "data/dataset_builder.h"
#include "data/gpt_dataset.h"
#include "data/indexed_dataset.h"
#include "test_util.h"

namespace fp8tron::data {
namespace {

using testing::ScratchDir;

const std::vector<int32_t> kLengths = {5, 3, 7, 2, 9, 4, 6, 1, 8, 3};

std::shared_ptr<const IndexedDataset> tiny(const std::string& prefix) {
  IndexedDatasetBuilder b(bin_path(prefix), DType::UInt16);
  for (size_t d = 0; d < kLengths.size(); ++d) {
    std::vector<int64_t> tokens;
    for (int p = 0; p < kLengths[d]; ++p) tokens.push_back(int64_t(d) * 100 + p);
    b.add_document(tokens.data(), int64_t(tokens.size()), {kLengths[d]});
  }
  b.finalize(idx_path(prefix));
  return std::make_shared<const IndexedDataset>(prefix);
}

// Documents of random lengths whose token t of document d is d * 10000 + t, so any token says
// where it came from.
std::shared_ptr<const IndexedDataset> random_docs(const std::string& prefix, int n, uint32_t seed) {
  std::mt19937 rng(seed);
  IndexedDatasetBuilder b(bin_path(prefix), DType::Int32);
  for (int d = 0; d < n; ++d) {
    const int len = 1 + int(rng() % 60);
    std::vector<int64_t> tokens;
    for (int t = 0; t < len; ++t) tokens.push_back(int64_t(d) * 10000 + t);
    b.add_document(tokens.data(), len, {len});
  }
  b.finalize(idx_path(prefix));
  return std::make_shared<const IndexedDataset>(prefix);
}

std::vector<int64_t> to_vector(const NpyArray& a) {
  std::vector<int64_t> v;
  for (int64_t i = 0; i < a.numel(); ++i) v.push_back(a.at(i));
  return v;
}

GptDatasetConfig config(const ScratchDir& dir, int64_t seq = 4) {
  GptDatasetConfig c;
  c.sequence_length = seq;
  c.seed = 1234;
  c.cache_dir = dir / "cache";
  return c;
}

// Golden values: Megatron-LM's GPTDataset (numpy RandomState + helpers.cpp) on the same
// documents with --seq-length 4 --seed 1234 --split 100,0,0.
TEST(GptDataset, MatchesMegatronTwoEpochs) {
  ScratchDir dir;
  GptDataset ds(tiny(dir / "tiny"), {0, 10}, 12, Split::Train, config(dir));
  EXPECT_EQ(ds.num_epochs(), 2);
  EXPECT_EQ(to_vector(ds.document_index()),
            (std::vector<int64_t>{7, 2, 9, 1, 0, 8, 4, 5, 6, 3, 7, 3, 5, 1, 4, 8, 0, 2, 6, 9}));
  EXPECT_EQ(to_vector(ds.sample_index()),
            (std::vector<int64_t>{0, 0, 1, 3, 2, 0, 3, 1, 4, 2, 5, 1, 5, 5, 6, 1, 6, 5, 7, 0, 8, 0, 8, 4, 10, 0, 12, 1,
                                  13, 1, 14, 2, 14, 6, 15, 1, 15, 5, 16, 1, 17, 0, 17, 4, 18, 1, 18, 5}));
  EXPECT_EQ(to_vector(ds.shuffle_index()),
            (std::vector<int64_t>{8, 1, 7, 10, 9, 5, 4, 3, 0, 2, 6, 19, 16, 17, 12, 15, 22, 13, 14, 21, 20, 11, 18}));
  EXPECT_EQ(ds.document_index().type(), NpyType::Int32);
  EXPECT_EQ(ds.sample_index().type(), NpyType::Int32);
  EXPECT_EQ(ds.shuffle_index().type(), NpyType::UInt32);
  std::vector<int64_t> s(5);
  ds.sample(0, s.data());
  EXPECT_EQ(s, (std::vector<int64_t>{405, 406, 407, 408, 500}));  // crosses from document 4 into 5
  ds.sample(5, s.data());
  EXPECT_EQ(s, (std::vector<int64_t>{801, 802, 803, 804, 805}));
}

TEST(GptDataset, MatchesMegatronSeparateFinalEpoch) {
  ScratchDir dir;
  GptDataset ds(tiny(dir / "tiny"), {0, 10}, 30, Split::Train, config(dir));
  EXPECT_EQ(ds.num_epochs(), 3);
  EXPECT_TRUE(gpt_separate_final_epoch(48, 3, 30, 4, 1));
  EXPECT_EQ(to_vector(ds.document_index()),
            (std::vector<int64_t>{3, 3, 2, 6, 4, 5, 4, 0, 8, 8, 7, 1, 0, 9, 7, 1, 9, 2, 6, 5, 8, 1, 7, 6, 9, 5, 4, 3, 0, 2}));
  EXPECT_EQ(to_vector(ds.shuffle_index()),
            (std::vector<int64_t>{6, 19, 20, 5, 8, 15, 4, 22, 10, 13, 14, 18, 1, 12, 17, 2, 3, 16, 21, 9, 0, 11, 7, 25,
                                  26, 33, 32, 29, 34, 24, 31, 28, 23, 27, 30}));
  std::vector<int64_t> s(5);
  ds.sample(0, s.data());
  EXPECT_EQ(s, (std::vector<int64_t>{407, 408, 500, 501, 502}));
  ds.sample(5, s.data());
  EXPECT_EQ(s, (std::vector<int64_t>{700, 100, 101, 102, 0}));  // three documents in one sample
}

TEST(GptDataset, EpochArithmetic) {
  EXPECT_EQ(gpt_num_epochs(48, std::nullopt, 4, 1), 1);
  EXPECT_EQ(gpt_num_epochs(48, 11, 4, 1), 1);  // 11 * 4 + 1 = 45 tokens <= 48
  EXPECT_EQ(gpt_num_epochs(48, 12, 4, 1), 2);  // 49 > 48
  EXPECT_EQ(gpt_num_epochs(48, 24, 4, 1), 3);  // 97 > 96
  EXPECT_FALSE(gpt_separate_final_epoch(48, 1, 5, 4, 1));
  // Samples per epoch: (48 - 1) / 4 = 11; the final epoch is separate below int(0.8 * 11) = 8 samples.
  EXPECT_TRUE(gpt_separate_final_epoch(48, 2, 12, 4, 1));   // 1 sample from the 2nd epoch
  EXPECT_TRUE(gpt_separate_final_epoch(48, 2, 18, 4, 1));   // 7
  EXPECT_FALSE(gpt_separate_final_epoch(48, 2, 19, 4, 1));  // 8
}

// Every sample is a window of the token stream of document_index, consecutive samples share
// exactly one token, and the stream covers whole documents.
TEST(GptDataset, SamplesAreWindowsOfTheDocumentStream) {
  ScratchDir dir;
  auto data = random_docs(dir / "r", 200, 7);
  GptDataset ds(data, {0, 200}, 900, Split::Train, config(dir, 32));
  std::vector<int64_t> stream;
  for (int64_t i = 0; i < ds.document_index().numel(); ++i) {
    auto t = data->get(ds.document_index().at(i));
    stream.insert(stream.end(), t.begin(), t.end());
  }
  std::vector<int64_t> s(33);
  int64_t spanning = 0;
  // Sample i is row shuffle[i] of the sample index, which starts at stream token 32 * row.
  std::vector<int64_t> shuffle = to_vector(ds.shuffle_index());
  for (int64_t i = 0; i < ds.size(); ++i) {
    ds.sample(i, s.data());
    const int64_t start = shuffle[size_t(i)] * 32;
    ASSERT_TRUE(std::equal(s.begin(), s.end(), stream.begin() + start)) << "sample " << i;
    spanning += s.front() / 10000 != s.back() / 10000;
  }
  EXPECT_GT(spanning, ds.size() / 2);  // most 33-token samples cross a document boundary
  EXPECT_GE(ds.size(), 900);
}

TEST(GptDataset, DocumentIndexCoversEveryDocumentOncePerEpoch) {
  ScratchDir dir;
  GptDataset ds(random_docs(dir / "r", 100, 3), {10, 60}, 500, Split::Train, config(dir, 16));
  std::map<int64_t, int> count;
  for (int64_t d : to_vector(ds.document_index())) ++count[d];
  EXPECT_EQ(count.size(), 50u);
  EXPECT_EQ(count.begin()->first, 10);
  EXPECT_EQ(count.rbegin()->first, 59);
  for (const auto& [doc, n] : count) EXPECT_EQ(n, ds.num_epochs()) << "document " << doc;
  // The shuffle index is a permutation.
  auto shuffle = to_vector(ds.shuffle_index());
  std::sort(shuffle.begin(), shuffle.end());
  for (int64_t i = 0; i < int64_t(shuffle.size()); ++i) ASSERT_EQ(shuffle[size_t(i)], i);
}

TEST(GptDataset, DeterministicPerSeed) {
  ScratchDir dir;
  auto data = random_docs(dir / "r", 100, 3);
  auto c = config(dir, 16);
  GptDataset a(data, {0, 100}, 300, Split::Train, c);
  c.cache_dir = dir / "cache2";
  GptDataset b(data, {0, 100}, 300, Split::Train, c);
  c.seed = 1235;
  GptDataset other(data, {0, 100}, 300, Split::Train, c);
  std::vector<int64_t> x(17), y(17), z(17);
  int differ = 0;
  for (int64_t i = 0; i < 300; ++i) {
    a.sample(i, x.data());
    b.sample(i, y.data());
    other.sample(i, z.data());
    ASSERT_EQ(x, y);
    differ += x != z;
  }
  EXPECT_GT(differ, 250);
}

TEST(GptDataset, SplitsDoNotShareDocuments) {
  ScratchDir dir;
  auto data = random_docs(dir / "r", 1000, 5);
  GptDatasetsConfig c;
  c.blend = parse_blend({dir / "r"});
  c.split = "969,30,1";
  c.sizes = {2000, 100, 10};
  c.gpt = config(dir, 16);
  const auto splits = build_gpt_datasets(c);
  std::set<int64_t> seen[3];
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(splits[i]);
    std::vector<int64_t> s(17);
    for (int64_t k = 0; k < splits[i]->size(); ++k) {
      splits[i]->sample(k, s.data());
      for (int64_t t : s) seen[i].insert(t / 10000);
    }
  }
  // Documents [0, 969) train, [969, 999) valid, [999, 1000) test.
  EXPECT_EQ(*seen[0].rbegin(), 968);
  EXPECT_EQ(*seen[1].begin(), 969);
  EXPECT_EQ(*seen[1].rbegin(), 998);
  EXPECT_EQ(seen[2], std::set<int64_t>{999});
}

TEST(GptDataset, CacheIsReusedAndKeyedByParameters) {
  ScratchDir dir;
  auto data = random_docs(dir / "r", 50, 1);
  GptDataset first(data, {0, 50}, 100, Split::Train, config(dir, 8));
  EXPECT_TRUE(first.built_indices());
  GptDataset again(data, {0, 50}, 100, Split::Train, config(dir, 8));
  EXPECT_FALSE(again.built_indices());
  GptDataset more(data, {0, 50}, 101, Split::Train, config(dir, 8));
  EXPECT_TRUE(more.built_indices());
  const std::string description = testing::read_file(first.cache_path("description.txt"));
  EXPECT_NE(description.find("num_samples: 100"), std::string::npos);
  EXPECT_NE(description.find("sequence_length: 8"), std::string::npos);
}

TEST(GptDataset, DefaultCacheDirIsNextToTheData) {
  ScratchDir dir;
  auto data = random_docs(dir / "r", 20, 1);
  GptDatasetConfig c = config(dir, 8);
  c.cache_dir.clear();
  GptDataset ds(data, {0, 20}, 10, Split::Train, c);
  EXPECT_EQ(ds.cache_path("x").rfind(dir / "r/cache/GPTDataset_indices/", 0), 0u);
}

// Many ranks starting together: one builds, the others wait on the lock and load.
TEST(GptDataset, ConcurrentBuildersBuildOnce) {
  ScratchDir dir;
  auto data = random_docs(dir / "r", 3000, 9);
  std::atomic<int> built{0};
  std::vector<std::thread> ranks;
  std::vector<std::vector<int64_t>> first_samples(6, std::vector<int64_t>(65));
  for (int r = 0; r < 6; ++r) {
    ranks.emplace_back([&, r] {
      GptDataset ds(data, {0, 3000}, 20000, Split::Train, config(dir, 64));
      built += ds.built_indices();
      ds.sample(123, first_samples[size_t(r)].data());
    });
  }
  for (auto& t : ranks) t.join();
  EXPECT_EQ(built.load(), 1);
  for (int r = 1; r < 6; ++r) EXPECT_EQ(first_samples[size_t(r)], first_samples[0]);
}

TEST(GptDataset, StaleOrForeignCacheIsRebuilt) {
  ScratchDir dir;
  auto data = random_docs(dir / "r", 50, 1);
  GptDataset first(data, {0, 50}, 100, Split::Train, config(dir, 8));
  testing::write_file(first.cache_path("description.txt"), "something else");
  GptDataset again(data, {0, 50}, 100, Split::Train, config(dir, 8));
  EXPECT_TRUE(again.built_indices());
}

TEST(GptDataset, EmptySplitIsAClearError) {
  ScratchDir dir;
  auto data = random_docs(dir / "r", 10, 1);
  EXPECT_USER_ERROR(GptDataset(data, {10, 10}, 5, Split::Test, config(dir, 8)), "test split", "--split");
  GptDataset nothing_wanted(data, {10, 10}, 0, Split::Test, config(dir, 8));
  EXPECT_EQ(nothing_wanted.size(), 0);
}

TEST(GptDataset, PartialLastValidationSampleIsPadded) {
  ScratchDir dir;
  auto c = config(dir, 5);
  c.drop_last_partial_validation_sequence = false;
  GptDataset ds(tiny(dir / "tiny"), {0, 10}, std::nullopt, Split::Valid, c);
  // 48 tokens, samples of 5 + 1 sharing one token: ceil(47 / 5) = 10 samples, the last partial.
  ASSERT_EQ(ds.size(), 10);
  int padded = 0;
  std::vector<int64_t> s(6);
  for (int64_t i = 0; i < 10; ++i) {
    ds.sample(i, s.data());
    padded += std::count(s.begin(), s.end(), kPadTokenId) > 0;
  }
  EXPECT_EQ(padded, 1);
}

}  // namespace
}  // namespace fp8tron::data
