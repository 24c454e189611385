#include "data/indexed_dataset.h"

#include <sys/stat.h>

#include <bit>
#include <cerrno>
#include <cstring>
#include <limits>

#include "core/error.h"
#include "core/text.h"

namespace fp8tron::data {

static_assert(std::endian::native == std::endian::little, "the .bin/.idx formats are little-endian");

bool is_valid_dtype_code(int code) { return code >= 1 && code <= 8; }

int dtype_size(DType dtype) {
  switch (dtype) {
    case DType::UInt8: case DType::Int8: return 1;
    case DType::Int16: case DType::UInt16: return 2;
    case DType::Int32: case DType::Float32: return 4;
    case DType::Int64: case DType::Float64: return 8;
  }
  FP8TRON_CHECK(false, "unknown dtype");
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::UInt8: return "uint8";
    case DType::Int8: return "int8";
    case DType::Int16: return "int16";
    case DType::Int32: return "int32";
    case DType::Int64: return "int64";
    case DType::Float64: return "float64";
    case DType::Float32: return "float32";
    case DType::UInt16: return "uint16";
  }
  return "?";
}

DType optimal_dtype(int64_t vocab_size) { return vocab_size < 65500 ? DType::UInt16 : DType::Int32; }

std::string idx_path(const std::string& prefix) { return prefix + ".idx"; }
std::string bin_path(const std::string& prefix) { return prefix + ".bin"; }

namespace {

bool file_exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

template <class T>
T load(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

// Element i of a .bin array of `dtype`, widened to int64 (floats truncate, as numpy's astype).
int64_t load_token(const char* p, DType dtype) {
  switch (dtype) {
    case DType::UInt8: return load<uint8_t>(p);
    case DType::Int8: return load<int8_t>(p);
    case DType::Int16: return load<int16_t>(p);
    case DType::UInt16: return load<uint16_t>(p);
    case DType::Int32: return load<int32_t>(p);
    case DType::Int64: return load<int64_t>(p);
    case DType::Float32: return int64_t(load<float>(p));
    case DType::Float64: return int64_t(load<double>(p));
  }
  return 0;
}

template <class T>
void store_checked(char* p, int64_t value, DType dtype, const std::string& path) {
  if constexpr (std::is_integral_v<T>) {
    if (value < int64_t(std::numeric_limits<T>::min()) || value > int64_t(std::numeric_limits<T>::max()))
      throw UserError(strprintf("token id %lld does not fit the %s tokens of %s: use a larger dtype",
                                (long long)value, dtype_name(dtype), path.c_str()));
  }
  T v = static_cast<T>(value);
  std::memcpy(p, &v, sizeof(T));
}

void store_token(char* p, int64_t value, DType dtype, const std::string& path) {
  switch (dtype) {
    case DType::UInt8: return store_checked<uint8_t>(p, value, dtype, path);
    case DType::Int8: return store_checked<int8_t>(p, value, dtype, path);
    case DType::Int16: return store_checked<int16_t>(p, value, dtype, path);
    case DType::UInt16: return store_checked<uint16_t>(p, value, dtype, path);
    case DType::Int32: return store_checked<int32_t>(p, value, dtype, path);
    case DType::Int64: return store_checked<int64_t>(p, value, dtype, path);
    case DType::Float32: return store_checked<float>(p, value, dtype, path);
    case DType::Float64: return store_checked<double>(p, value, dtype, path);
  }
}

void write_all(std::FILE* f, const void* data, size_t bytes, const std::string& path) {
  if (bytes && std::fwrite(data, 1, bytes, f) != bytes)
    throw UserError(strprintf("cannot write %s: %s", path.c_str(), std::strerror(errno)));
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Reader

IndexedDataset::IndexedDataset(const std::string& path_prefix) : prefix_(path_prefix) {
  const std::string idx = idx_path(prefix_), bin = bin_path(prefix_);
  if (!file_exists(idx) || !file_exists(bin))
    throw UserError(strprintf("dataset %s: %s%s%s not found (a dataset is a .bin/.idx pair written by "
                              "fp8tron-preprocess or Megatron's tools/preprocess_data.py; pass the "
                              "path without the extension)",
                              prefix_.c_str(), file_exists(idx) ? "" : idx.c_str(),
                              !file_exists(idx) && !file_exists(bin) ? " and " : "",
                              file_exists(bin) ? "" : bin.c_str()));
  idx_ = MappedFile(idx);
  bin_ = MappedFile(bin);
  parse_index();
  validate_sequences();
}

bool IndexedDataset::exists(const std::string& path_prefix) {
  return file_exists(idx_path(path_prefix)) && file_exists(bin_path(path_prefix));
}

void IndexedDataset::parse_index() {
  const char* file = idx_.path().c_str();
  const uint64_t size = idx_.size();
  const char* p = idx_.data();
  if (size < uint64_t(kIndexHeaderBytes))
    throw UserError(strprintf("%s is truncated: %llu bytes, shorter than the %lld-byte MMIDIDX header",
                              file, (unsigned long long)size, (long long)kIndexHeaderBytes));
  if (std::memcmp(p, kIndexMagic, sizeof(kIndexMagic)) != 0) {
    const bool legacy = std::memcmp(p, "TNTIDX\0\0", 8) == 0;
    throw UserError(strprintf("%s is not a Megatron MMIDIDX index (bad magic bytes)%s", file,
                              legacy ? ": it is the old lazy/cached 'TNTIDX' format; re-run preprocessing"
                                     : ""));
  }
  const uint64_t version = load<uint64_t>(p + 9);
  if (version != 1)
    throw UserError(strprintf("%s has index version %llu; only version 1 is supported", file,
                              (unsigned long long)version));
  const int code = uint8_t(p[17]);
  if (!is_valid_dtype_code(code))
    throw UserError(strprintf("%s has unknown dtype code %d (valid: 1-8)", file, code));
  dtype_ = DType(code);
  const uint64_t n = load<uint64_t>(p + 18), d = load<uint64_t>(p + 26);
  // Guard the arithmetic below against absurd counts from a corrupt header.
  if (n > size || d > size)
    throw UserError(strprintf("%s is corrupt: header claims %llu sequences and %llu document indices "
                              "in a %llu-byte file", file, (unsigned long long)n, (unsigned long long)d,
                              (unsigned long long)size));
  const uint64_t expected = kIndexHeaderBytes + 12 * n + 8 * d;
  // Multimodal datasets append one int8 mode per sequence; the modes are not used for GPT.
  if (size != expected && size != expected + n)
    throw UserError(strprintf("%s is truncated or corrupt: %llu bytes, expected %llu for %llu sequences "
                              "and %llu document indices", file, (unsigned long long)size,
                              (unsigned long long)expected, (unsigned long long)n, (unsigned long long)d));
  lengths_ = PackedArray<int32_t>(p + kIndexHeaderBytes, int64_t(n));
  pointers_ = PackedArray<int64_t>(p + kIndexHeaderBytes + 4 * n, int64_t(n));
  documents_ = PackedArray<int64_t>(p + kIndexHeaderBytes + 12 * n, int64_t(d));
  if (d == 0 || documents_[0] != 0)
    throw UserError(strprintf("%s is corrupt: the document indices must start with 0", file));
  if (documents_[int64_t(d) - 1] != int64_t(n))
    throw UserError(strprintf("%s is corrupt: the last document index is %lld, expected the sequence "
                              "count %llu", file, (long long)documents_[int64_t(d) - 1], (unsigned long long)n));
  for (int64_t i = 1; i < int64_t(d); ++i)
    if (documents_[i] < documents_[i - 1])
      throw UserError(strprintf("%s is corrupt: document indices decrease at document %lld", file, (long long)i));
}

// Every sequence must lie inside the .bin, and the .bin must be exactly as long as the index says:
// a longer or shorter .bin means the pair does not belong together or a copy was cut short.
void IndexedDataset::validate_sequences() {
  const int64_t item = dtype_size(dtype_);
  const int64_t bin_size = int64_t(bin_.size());
  int64_t end = 0, tokens = 0;
  for (int64_t i = 0; i < lengths_.size(); ++i) {
    const int64_t len = lengths_[i], ptr = pointers_[i];
    if (len < 0)
      throw UserError(strprintf("%s is corrupt: sequence %lld has negative length %lld", idx_.path().c_str(),
                                (long long)i, (long long)len));
    if (ptr < 0 || ptr % item != 0 || ptr + len * item > bin_size)
      throw UserError(strprintf("%s and %s do not match: sequence %lld (byte offset %lld, %lld tokens of %s) lies "
                                "outside the %lld-byte .bin (truncated copy or mismatched pair?)",
                                idx_.path().c_str(), bin_.path().c_str(), (long long)i, (long long)ptr,
                                (long long)len, dtype_name(dtype_), (long long)bin_size));
    end = std::max(end, ptr + len * item);
    tokens += len;
  }
  if (end != bin_size)
    throw UserError(strprintf("%s and %s do not match: the index covers %lld bytes but the .bin has %lld "
                              "(mismatched pair or wrong dtype?)",
                              idx_.path().c_str(), bin_.path().c_str(), (long long)end, (long long)bin_size));
  num_tokens_ = tokens;
}

void IndexedDataset::read(int64_t sequence, int64_t offset, int64_t length, int64_t* out) const {
  FP8TRON_CHECK(sequence >= 0 && sequence < num_sequences(), strprintf("sequence %lld", (long long)sequence));
  FP8TRON_CHECK(offset >= 0 && length >= 0 && offset + length <= lengths_[sequence],
                strprintf("tokens [%lld, %lld) of a sequence of %d", (long long)offset,
                          (long long)(offset + length), lengths_[sequence]));
  const int64_t item = dtype_size(dtype_);
  const char* p = bin_.data() + pointers_[sequence] + offset * item;
  switch (dtype_) {  // the common token types get a tight loop
    case DType::UInt16:
      for (int64_t i = 0; i < length; ++i) out[i] = load<uint16_t>(p + 2 * i);
      return;
    case DType::Int32:
      for (int64_t i = 0; i < length; ++i) out[i] = load<int32_t>(p + 4 * i);
      return;
    default:
      for (int64_t i = 0; i < length; ++i) out[i] = load_token(p + i * item, dtype_);
  }
}

std::string IndexedDataset::identity() const {
  return strprintf("dataset_path: %s\ndataset_sequences: %lld\ndataset_tokens: %lld\ndataset_idx_bytes: %lld\n",
                   prefix_.c_str(), (long long)num_sequences(), (long long)num_tokens(), (long long)idx_bytes());
}

std::string IndexedDataset::origin(int64_t sequence, int64_t token) const {
  // The document holding the sequence: the last boundary at or before it.
  int64_t lo = 0, hi = documents_.size() - 1;
  while (hi - lo > 1) {
    const int64_t mid = (lo + hi) / 2;
    (documents_[mid] <= sequence ? lo : hi) = mid;
  }
  const std::string where = lo == sequence ? strprintf("document %lld", (long long)lo)
                                           : strprintf("document %lld (sequence %lld)", (long long)lo, (long long)sequence);
  return strprintf("dataset %s, %s, token %lld of it", prefix_.c_str(), where.c_str(), (long long)token);
}

std::vector<int64_t> IndexedDataset::get(int64_t sequence) const {
  std::vector<int64_t> out(static_cast<size_t>(sequence_length(sequence)));
  read(sequence, 0, int64_t(out.size()), out.data());
  return out;
}

// ---------------------------------------------------------------------------------------------
// Writer

IndexedDatasetBuilder::IndexedDatasetBuilder(const std::string& bin_path, DType dtype)
    : bin_path_(bin_path), dtype_(dtype) {
  bin_ = std::fopen(bin_path.c_str(), "wb");
  if (!bin_) throw UserError(strprintf("cannot create %s: %s", bin_path.c_str(), std::strerror(errno)));
  std::setvbuf(bin_, nullptr, _IOFBF, 1 << 20);
}

IndexedDatasetBuilder::~IndexedDatasetBuilder() {
  if (bin_) std::fclose(bin_);
}

void IndexedDatasetBuilder::write_tokens(const int64_t* tokens, int64_t count) {
  const int item = dtype_size(dtype_);
  scratch_.resize(size_t(count) * item);
  for (int64_t i = 0; i < count; ++i) store_token(scratch_.data() + i * item, tokens[i], dtype_, bin_path_);
  write_all(bin_, scratch_.data(), scratch_.size(), bin_path_);
}

void IndexedDatasetBuilder::add_item(const int64_t* tokens, int64_t count) {
  FP8TRON_CHECK(count <= std::numeric_limits<int32_t>::max(), "sequence longer than 2^31 tokens");
  write_tokens(tokens, count);
  lengths_.push_back(int32_t(count));
}

void IndexedDatasetBuilder::end_document() { documents_.push_back(int64_t(lengths_.size())); }

void IndexedDatasetBuilder::add_document(const int64_t* tokens, int64_t count, const std::vector<int32_t>& lengths) {
  int64_t total = 0;
  for (int32_t len : lengths) total += len;
  FP8TRON_CHECK(total == count, "sequence lengths must add up to the document's token count");
  write_tokens(tokens, count);
  lengths_.insert(lengths_.end(), lengths.begin(), lengths.end());
  end_document();
}

void IndexedDatasetBuilder::add_index(const std::string& path_prefix) {
  IndexedDataset other(path_prefix);
  if (other.dtype() != dtype_)
    throw UserError(strprintf("cannot merge %s: its tokens are %s, this dataset's are %s", path_prefix.c_str(),
                              dtype_name(other.dtype()), dtype_name(dtype_)));
  const int64_t offset = int64_t(lengths_.size());
  for (int64_t i = 0; i < other.num_sequences(); ++i) lengths_.push_back(other.sequence_length(i));
  for (int64_t i = 1; i < other.document_indices().size(); ++i) documents_.push_back(offset + other.document_indices()[i]);
  MappedFile bin(bin_path(path_prefix));
  write_all(bin_, bin.data(), bin.size(), bin_path_);
}

void IndexedDatasetBuilder::finalize(const std::string& idx_path) {
  if (std::fclose(bin_) != 0) {
    bin_ = nullptr;
    throw UserError(strprintf("cannot write %s: %s", bin_path_.c_str(), std::strerror(errno)));
  }
  bin_ = nullptr;
  write_index(idx_path, dtype_, lengths_, documents_);
}

void write_index(const std::string& idx_path, DType dtype, const std::vector<int32_t>& lengths,
                 const std::vector<int64_t>& document_indices) {
  std::FILE* f = std::fopen(idx_path.c_str(), "wb");
  if (!f) throw UserError(strprintf("cannot create %s: %s", idx_path.c_str(), std::strerror(errno)));
  std::setvbuf(f, nullptr, _IOFBF, 1 << 20);
  try {
    const uint64_t version = 1, n = lengths.size(), d = document_indices.size();
    const uint8_t code = uint8_t(dtype);
    write_all(f, kIndexMagic, sizeof(kIndexMagic), idx_path);
    write_all(f, &version, 8, idx_path);
    write_all(f, &code, 1, idx_path);
    write_all(f, &n, 8, idx_path);
    write_all(f, &d, 8, idx_path);
    write_all(f, lengths.data(), 4 * n, idx_path);
    // Byte offset of each sequence in the .bin: the running sum of length * item size.
    std::vector<int64_t> pointers(n);
    int64_t ptr = 0;
    for (uint64_t i = 0; i < n; ++i) {
      pointers[i] = ptr;
      ptr += int64_t(lengths[i]) * dtype_size(dtype);
    }
    write_all(f, pointers.data(), 8 * n, idx_path);
    write_all(f, document_indices.data(), 8 * d, idx_path);
  } catch (...) {
    std::fclose(f);
    throw;
  }
  if (std::fclose(f) != 0) throw UserError(strprintf("cannot write %s: %s", idx_path.c_str(), std::strerror(errno)));
}

}  // namespace fp8tron::data
