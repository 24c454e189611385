#include <gtest/gtest.h>

#include <cstring>

#include "data/indexed_dataset.h"
#include "test_util.h"

namespace fp8tron::data {
namespace {

using testing::ScratchDir;

// Ten documents of lengths 5 3 7 2 9 4 6 1 8 3 holding d * 100 + position: the dataset the
// Megatron golden values in these tests were computed on.
const std::vector<int32_t> kLengths = {5, 3, 7, 2, 9, 4, 6, 1, 8, 3};

void write_tiny(const std::string& prefix, DType dtype = DType::UInt16) {
  IndexedDatasetBuilder b(bin_path(prefix), dtype);
  for (size_t d = 0; d < kLengths.size(); ++d) {
    std::vector<int64_t> tokens;
    for (int p = 0; p < kLengths[d]; ++p) tokens.push_back(int64_t(d) * 100 + p);
    b.add_document(tokens.data(), int64_t(tokens.size()), {kLengths[d]});
  }
  b.finalize(idx_path(prefix));
}

TEST(IndexedDataset, HeaderBytesMatchMegatron) {
  ScratchDir dir;
  write_tiny(dir / "tiny");
  const std::string idx = testing::read_file(dir / "tiny.idx");
  // Bytes written by Megatron's IndexedDatasetBuilder for the same documents (xxd of its file).
  const unsigned char header[] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', 0, 0,  // magic
                                  1, 0, 0, 0, 0, 0, 0, 0,                   // version 1
                                  8,                                        // dtype code: uint16
                                  10, 0, 0, 0, 0, 0, 0, 0,                  // 10 sequences
                                  11, 0, 0, 0, 0, 0, 0, 0,                  // 11 document indices
                                  5, 0, 0, 0, 3, 0, 0, 0, 7, 0, 0, 0, 2, 0};
  ASSERT_GE(idx.size(), sizeof(header));
  EXPECT_EQ(0, std::memcmp(idx.data(), header, sizeof(header)));
  EXPECT_EQ(idx.size(), size_t(34 + 10 * 4 + 10 * 8 + 11 * 8));
  // Pointers are byte offsets: 0, 10, 16, ... for uint16 tokens.
  int64_t pointer2;
  std::memcpy(&pointer2, idx.data() + 34 + 40 + 2 * 8, 8);
  EXPECT_EQ(pointer2, (5 + 3) * 2);
  EXPECT_EQ(testing::read_file(dir / "tiny.bin").size(), size_t(48 * 2));
}

TEST(IndexedDataset, RoundTripEveryDtype) {
  ScratchDir dir;
  for (int code = 1; code <= 8; ++code) {
    const DType dtype = DType(code);
    const std::string prefix = dir / ("d" + std::to_string(code));
    // Byte-wide types cannot hold d * 100 + p; they get small values.
    if (dtype == DType::UInt8 || dtype == DType::Int8) {
      IndexedDatasetBuilder b(bin_path(prefix), dtype);
      const std::vector<int64_t> a = {1, 2, 3}, empty;
      b.add_document(a.data(), 3, {2, 1});
      b.add_document(empty.data(), 0, {});
      b.finalize(idx_path(prefix));
      IndexedDataset d(prefix);
      EXPECT_EQ(d.dtype(), dtype);
      EXPECT_EQ(d.num_sequences(), 2);
      EXPECT_EQ(d.num_documents(), 2);
      EXPECT_EQ(d.get(0), (std::vector<int64_t>{1, 2}));
      EXPECT_EQ(d.get(1), (std::vector<int64_t>{3}));
      continue;
    }
    write_tiny(prefix, dtype);
    IndexedDataset d(prefix);
    EXPECT_EQ(d.dtype(), dtype) << dtype_name(dtype);
    ASSERT_EQ(d.num_sequences(), 10);
    EXPECT_EQ(d.num_documents(), 10);
    EXPECT_EQ(d.num_tokens(), 48);
    for (int64_t s = 0; s < 10; ++s) {
      ASSERT_EQ(d.sequence_length(s), kLengths[size_t(s)]);
      const auto tokens = d.get(s);
      for (int p = 0; p < kLengths[size_t(s)]; ++p) EXPECT_EQ(tokens[size_t(p)], s * 100 + p);
    }
    int64_t part[2];
    d.read(4, 3, 2, part);
    EXPECT_EQ(part[0], 403);
    EXPECT_EQ(part[1], 404);
  }
}

TEST(IndexedDataset, EmptyDocumentsAndSentencesKeepBoundaries) {
  ScratchDir dir;
  IndexedDatasetBuilder b(dir / "s.bin", DType::Int32);
  const std::vector<int64_t> doc = {10, 11, 12, 13, 14}, empty;
  b.add_document(doc.data(), 5, {2, 3});  // two sentences
  b.add_document(empty.data(), 0, {});    // an empty document: a boundary, no sequence
  b.add_item(doc.data(), 1);
  b.end_document();
  b.finalize(dir / "s.idx");
  IndexedDataset d(dir / "s");
  EXPECT_EQ(d.num_sequences(), 3);
  ASSERT_EQ(d.num_documents(), 3);
  const auto& docs = d.document_indices();
  EXPECT_EQ((std::vector<int64_t>{docs[0], docs[1], docs[2], docs[3]}), (std::vector<int64_t>{0, 2, 2, 3}));
}

TEST(IndexedDataset, AddIndexConcatenates) {
  ScratchDir dir;
  write_tiny(dir / "a");
  IndexedDatasetBuilder b(dir / "ab.bin", DType::UInt16);
  b.add_index(dir / "a");
  b.add_index(dir / "a");
  b.finalize(dir / "ab.idx");
  IndexedDataset d(dir / "ab");
  EXPECT_EQ(d.num_sequences(), 20);
  EXPECT_EQ(d.num_documents(), 20);
  EXPECT_EQ(d.get(13), (std::vector<int64_t>{300, 301}));
  IndexedDatasetBuilder wrong(dir / "c.bin", DType::Int32);
  EXPECT_USER_ERROR(wrong.add_index(dir / "a"), "uint16", "int32");
}

TEST(IndexedDataset, TokenOutOfRangeForDtype) {
  ScratchDir dir;
  IndexedDatasetBuilder b(dir / "x.bin", DType::UInt16);
  const std::vector<int64_t> big = {70000};
  EXPECT_USER_ERROR(b.add_item(big.data(), 1), "70000", "uint16");
}

TEST(IndexedDataset, OptimalDtype) {
  EXPECT_EQ(optimal_dtype(50257), DType::UInt16);
  EXPECT_EQ(optimal_dtype(65499), DType::UInt16);
  EXPECT_EQ(optimal_dtype(65500), DType::Int32);
  EXPECT_EQ(optimal_dtype(128256), DType::Int32);
}

// ---- corrupt and mismatched files: a clear error naming the file, never a crash ----------

class CorruptIndex : public ::testing::Test {
 protected:
  void SetUp() override {
    write_tiny(dir / "t");
    idx = testing::read_file(dir / "t.idx");
    bin = testing::read_file(dir / "t.bin");
  }
  void rewrite(const std::string& new_idx, const std::string& new_bin) {
    testing::write_file(dir / "t.idx", new_idx);
    testing::write_file(dir / "t.bin", new_bin);
  }
  ScratchDir dir;
  std::string idx, bin;
};

TEST_F(CorruptIndex, MissingFiles) {
  std::filesystem::remove(dir / "t.bin");
  EXPECT_USER_ERROR(IndexedDataset(dir / "t"), "t.bin", "not found");
  EXPECT_USER_ERROR(IndexedDataset(dir / "nothing"), "nothing.idx", "nothing.bin");
}

TEST_F(CorruptIndex, BadMagic) {
  idx[0] = 'X';
  rewrite(idx, bin);
  EXPECT_USER_ERROR(IndexedDataset(dir / "t"), "t.idx", "magic");
}

TEST_F(CorruptIndex, BadVersion) {
  idx[9] = 2;
  rewrite(idx, bin);
  EXPECT_USER_ERROR(IndexedDataset(dir / "t"), "t.idx", "version 2");
}

TEST_F(CorruptIndex, BadDtypeCode) {
  idx[17] = 9;
  rewrite(idx, bin);
  EXPECT_USER_ERROR(IndexedDataset(dir / "t"), "t.idx", "dtype code 9");
}

TEST_F(CorruptIndex, TruncatedHeaderAndBody) {
  rewrite(idx.substr(0, 20), bin);
  EXPECT_USER_ERROR(IndexedDataset(dir / "t"), "t.idx", "truncated");
  rewrite(idx.substr(0, idx.size() - 8), bin);
  EXPECT_USER_ERROR(IndexedDataset(dir / "t"), "t.idx", "truncated or corrupt");
}

TEST_F(CorruptIndex, AbsurdCounts) {
  idx[25] = 0x7f;  // sequence count near 2^63
  rewrite(idx, bin);
  EXPECT_USER_ERROR(IndexedDataset(dir / "t"), "t.idx", "corrupt");
}

TEST_F(CorruptIndex, TruncatedBin) {
  rewrite(idx, bin.substr(0, bin.size() - 2));
  EXPECT_USER_ERROR(IndexedDataset(dir / "t"), "t.bin", "do not match");
}

TEST_F(CorruptIndex, LongerBinIsAMismatchedPair) {
  rewrite(idx, bin + std::string(64, '\0'));
  EXPECT_USER_ERROR(IndexedDataset(dir / "t"), "t.bin", "do not match");
}

TEST_F(CorruptIndex, PointerOutOfRange) {
  const int64_t bad = 1 << 20;
  std::memcpy(idx.data() + 34 + 40 + 3 * 8, &bad, 8);
  rewrite(idx, bin);
  EXPECT_USER_ERROR(IndexedDataset(dir / "t"), "sequence 3", "outside");
}

TEST_F(CorruptIndex, DocumentIndicesInconsistent) {
  const int64_t bad = 7;
  std::memcpy(idx.data() + 34 + 40 + 80 + 10 * 8, &bad, 8);  // last document index != 10
  rewrite(idx, bin);
  EXPECT_USER_ERROR(IndexedDataset(dir / "t"), "t.idx", "last document index");
}

TEST_F(CorruptIndex, IdxAndBinOfDifferentDatasets) {
  IndexedDatasetBuilder b(dir / "other.bin", DType::UInt16);
  const std::vector<int64_t> t = {1, 2, 3};
  b.add_document(t.data(), 3, {3});
  b.finalize(dir / "other.idx");
  rewrite(testing::read_file(dir / "other.idx"), bin);
  EXPECT_USER_ERROR(IndexedDataset(dir / "t"), "do not match");
}

}  // namespace
}  // namespace fp8tron::data
