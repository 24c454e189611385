// Megatron-LM's indexed dataset: a `.bin` file of token ids back to back and an `.idx` index
// ("MMIDIDX" format) describing where each sequence starts. Reader (memory-mapped) and writer,
// byte-compatible with megatron/core/datasets/indexed_dataset.py.
//
// .idx layout (all little-endian):
//   bytes 0..8    magic "MMIDIDX\0\0"
//   bytes 9..16   version, uint64 = 1
//   byte  17      dtype code of the .bin tokens (see DType)
//   bytes 18..25  sequence count N, uint64
//   bytes 26..33  document-index count D, uint64 (= documents + 1: it starts with 0)
//   then          int32 sequence_lengths[N], int64 sequence_pointers[N] (byte offsets into .bin),
//                 int64 document_indices[D] (sequence index where each document ends),
//                 optionally int8 sequence_modes[N] (multimodal datasets; ignored here).
// A "sequence" is a sentence when the data was split into sentences, else a whole document; GPT
// training samples sequences, so for GPT data the two coincide.
#pragma once
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "data/low_level_dataset.h"
#include "data/mapped_file.h"

namespace fp8tron::data {

// Megatron's DType enum: the code stored in byte 17 of the .idx.
enum class DType : uint8_t {
  UInt8 = 1, Int8 = 2, Int16 = 3, Int32 = 4, Int64 = 5, Float64 = 6, Float32 = 7, UInt16 = 8
};
bool is_valid_dtype_code(int code);
int dtype_size(DType dtype);
const char* dtype_name(DType dtype);
// DType.optimal_dtype: uint16 when the vocabulary has fewer than 65500 ids, else int32.
DType optimal_dtype(int64_t vocab_size);

constexpr char kIndexMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
constexpr int64_t kIndexHeaderBytes = 34;

std::string idx_path(const std::string& prefix);
std::string bin_path(const std::string& prefix);

class IndexedDataset : public LowLevelDataset {
 public:
  // Opens prefix.idx and prefix.bin and validates them against each other; every problem is a
  // UserError naming the file and what is wrong.
  explicit IndexedDataset(const std::string& path_prefix);
  static bool exists(const std::string& path_prefix);

  const std::string& path_prefix() const { return prefix_; }
  DType dtype() const { return dtype_; }
  int64_t num_sequences() const override { return lengths_.size(); }
  int64_t num_documents() const { return documents_.size() - 1; }
  int64_t num_tokens() const { return num_tokens_; }
  int64_t bin_bytes() const { return int64_t(bin_.size()); }
  int64_t idx_bytes() const { return int64_t(idx_.size()); }

  int32_t sequence_length(int64_t i) const { return lengths_[i]; }
  int64_t sequence_pointer(int64_t i) const { return pointers_[i]; }
  const PackedArray<int32_t>& sequence_lengths() const override { return lengths_; }
  const PackedArray<int64_t>& sequence_pointers() const { return pointers_; }
  const PackedArray<int64_t>& document_indices() const { return documents_; }

  // Tokens [offset, offset + length) of sequence i, widened to int64 (IndexedDataset.get).
  void read(int64_t sequence, int64_t offset, int64_t length, int64_t* out) const override;
  std::vector<int64_t> get(int64_t sequence) const;

  std::string name() const override { return prefix_; }
  std::string identity() const override;
  // "dataset <prefix>, document 12 (sequence 40), token 7 of it"
  std::string origin(int64_t sequence, int64_t token) const override;
  std::string default_cache_dir() const override { return prefix_ + "/cache/GPTDataset_indices"; }

 private:
  void parse_index();
  void validate_sequences();
  std::string prefix_;
  MappedFile idx_, bin_;
  DType dtype_ = DType::Int32;
  PackedArray<int32_t> lengths_;
  PackedArray<int64_t> pointers_, documents_;
  int64_t num_tokens_ = 0;
};

// Writes a .bin as tokens arrive and the .idx at finalize() (IndexedDatasetBuilder). Output is
// byte-identical to Megatron's builder for the same calls.
class IndexedDatasetBuilder {
 public:
  IndexedDatasetBuilder(const std::string& bin_path, DType dtype);
  ~IndexedDatasetBuilder();
  IndexedDatasetBuilder(const IndexedDatasetBuilder&) = delete;
  IndexedDatasetBuilder& operator=(const IndexedDatasetBuilder&) = delete;

  // One sequence; end_document() closes the document it belongs to.
  void add_item(const int64_t* tokens, int64_t count);
  void end_document();
  // A whole document made of sequences of the given lengths (their sum must equal count).
  // An empty document (count 0, no lengths) still records a document boundary, as Megatron does.
  void add_document(const int64_t* tokens, int64_t count, const std::vector<int32_t>& lengths);
  // Appends every sequence and document of an existing dataset of the same dtype.
  void add_index(const std::string& path_prefix);
  // Closes the .bin and writes the .idx.
  void finalize(const std::string& idx_path);

  int64_t num_sequences() const { return int64_t(lengths_.size()); }
  int64_t num_documents() const { return int64_t(documents_.size()) - 1; }

 private:
  void write_tokens(const int64_t* tokens, int64_t count);
  std::string bin_path_;
  DType dtype_;
  std::FILE* bin_ = nullptr;
  std::vector<char> scratch_;
  std::vector<int32_t> lengths_;
  std::vector<int64_t> documents_{0};
};

// Writes an .idx for the given sequence lengths and document indices (_IndexWriter).
void write_index(const std::string& idx_path, DType dtype, const std::vector<int32_t>& lengths,
                 const std::vector<int64_t>& document_indices);

}  // namespace fp8tron::data
