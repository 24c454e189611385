// The safetensors file format (Hugging Face), torch-free: raw bytes, a dtype enum and a shape.
//
//   [8 bytes: N, little-endian u64] [N bytes: JSON header, padded with spaces to N % 8 == 0]
//   [data: every tensor's bytes, contiguous, no gaps]
//
// The header maps each tensor name to {"dtype", "shape", "data_offsets": [begin, end)} (offsets
// relative to the start of the data) and may hold "__metadata__": a string-to-string map.
// Files written here list "__metadata__" first and the tensors in data order; tensors are
// stored largest element size first (stable otherwise), so with the 8-aligned header every
// tensor is naturally aligned in a mapping of the file, as the reference implementation does.
// A Python user opens them with `safetensors.safe_open(path, "pt")`.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "checkpoint/file_io.h"

namespace fp8tron::checkpoint {

enum class DType : uint8_t {
  F64, F32, F16, BF16, I64, I32, I16, I8, U8, BOOL, F8_E4M3, F8_E5M2,
  U64, U32, U16, F8_E8M0,
};

const char* dtype_name(DType dtype);                       // "BF16"
std::optional<DType> parse_dtype(std::string_view name);   // exact, case-sensitive as the spec
size_t dtype_size(DType dtype);                            // bytes per element
std::vector<std::string> dtype_names();                    // all, for error messages

using Shape = std::vector<int64_t>;
std::string shape_string(const Shape& shape);  // "[4096, 1024]"
// Product of the dims; nullopt on a negative dim or overflow past 2^62.
std::optional<int64_t> checked_numel(const Shape& shape);

// ---- writing -------------------------------------------------------------------------------

// One tensor to write. Its bytes come from `data` (host memory, row-major, numel * dtype_size
// bytes, read during the write) or, when `data` is null, from `fill`, which is asked for the
// bytes [offset, offset + n) of the tensor in order, into the writer's staging buffer (for
// device memory copied out piece by piece).
struct TensorToWrite {
  std::string name;
  DType dtype = DType::F32;
  Shape shape;
  const void* data = nullptr;
  std::function<void(uint64_t offset, void* dst, size_t n)> fill;
};

struct WriteOptions {
  bool fsync = true;            // fsync the file before it gets its final name
  bool reserve_space = true;    // fallocate the whole file first: a full disk fails fast
  size_t buffer_bytes = 16u << 20;         // staging for the header, small tensors and `fill`
  uint64_t writeback_every = 256u << 20;   // start writeback each N bytes (fsync mode only)
  FaultInjection fault;                    // tests: fail after N bytes with errno
};

struct WriteStats {
  uint64_t bytes = 0;    // file size
  double seconds = 0;    // wall time, fsync included
  // Each tensor's checksum (checksum.h) over the bytes written, in the order of the input.
  std::vector<uint64_t> checksums;
};

// Where every tensor goes: the header bytes exactly as written (length prefix, JSON, padding)
// and, per tensor in file order, its index in the input and its [begin, end) data offsets.
struct SafetensorsLayout {
  std::string header;
  std::vector<size_t> order;
  std::vector<uint64_t> begin, end;
  uint64_t data_bytes = 0;
};
SafetensorsLayout plan_safetensors(const std::vector<TensorToWrite>& tensors,
                                   const std::map<std::string, std::string>& metadata);

// Writes the file: to `<path>.partial` first, fsync, then renamed to `path`, so a file under
// its final name is always complete. Errors (bad names, a full disk, EIO) are UserErrors naming
// the file; the partial file is removed.
WriteStats write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                             const std::map<std::string, std::string>& metadata = {},
                             const WriteOptions& options = {});

// ---- reading -------------------------------------------------------------------------------

// A tensor inside an open file. `data` points into the mapping: valid while the file lives.
struct TensorView {
  std::string name;
  DType dtype = DType::F32;
  Shape shape;
  const std::byte* data = nullptr;
  uint64_t nbytes = 0;
  int64_t numel() const { return int64_t(nbytes / dtype_size(dtype)); }
};

// Validates a whole safetensors image held in memory: header length against the size, JSON,
// dtypes, shapes, offsets in range, contiguous and non-overlapping, dtype x shape = bytes.
// `source` names the file in errors. Returns the tensors in data order.
struct ParsedSafetensors {
  std::vector<TensorView> tensors;
  std::map<std::string, std::string> metadata;
};
ParsedSafetensors parse_safetensors(const std::byte* bytes, uint64_t size,
                                    const std::string& source);

// A safetensors file mapped read-only into memory and validated.
class SafetensorsFile {
 public:
  static SafetensorsFile open(const std::string& path);
  SafetensorsFile(SafetensorsFile&& other) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&& other) noexcept;
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;
  ~SafetensorsFile();

  const std::string& path() const { return path_; }
  const std::vector<TensorView>& tensors() const { return parsed_.tensors; }
  const std::map<std::string, std::string>& metadata() const { return parsed_.metadata; }
  const TensorView* find(std::string_view name) const;
  // Like find, but a missing name is a UserError naming the file (with a "did you mean").
  const TensorView& at(std::string_view name) const;

 private:
  SafetensorsFile() = default;
  std::string path_;
  void* map_ = nullptr;
  uint64_t size_ = 0;
  ParsedSafetensors parsed_;
};

}  // namespace fp8tron::checkpoint
