// A read-only memory-mapped file, and views of little-endian arrays stored at any byte offset in
// it. Megatron's .idx layout puts int32/int64 arrays at offset 34, so they are not naturally
// aligned: PackedArray reads each element with memcpy (one plain load on x86) instead of
// reinterpret_cast, which would be undefined behaviour.
#pragma once
#include <cstdint>
#include <cstring>
#include <string>

namespace fp8tron::data {

class MappedFile {
 public:
  MappedFile() = default;
  // Maps `path` read-only; throws UserError naming the file when it cannot be opened or mapped.
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const char* data() const { return data_; }
  uint64_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  void release();
  std::string path_;
  const char* data_ = nullptr;
  uint64_t size_ = 0;
};

template <class T>
class PackedArray {
 public:
  PackedArray() = default;
  PackedArray(const char* bytes, int64_t count) : bytes_(bytes), count_(count) {}
  T operator[](int64_t i) const {
    T value;
    std::memcpy(&value, bytes_ + i * int64_t(sizeof(T)), sizeof(T));
    return value;
  }
  int64_t size() const { return count_; }
  bool empty() const { return count_ == 0; }
  const char* bytes() const { return bytes_; }

 private:
  const char* bytes_ = nullptr;
  int64_t count_ = 0;
};

}  // namespace fp8tron::data
