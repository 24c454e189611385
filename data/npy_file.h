// Minimal .npy (NumPy array file, format 1.0) writer and memory-mapped reader for the cached
// dataset indices. .npy keeps the caches inspectable with numpy.load(path, mmap_mode="r").
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "data/mapped_file.h"

namespace fp8tron::data {

// The element types the index caches use, by numpy descr.
enum class NpyType { Int16, Int32, UInt32, Int64 };
int npy_type_size(NpyType type);
const char* npy_descr(NpyType type);  // "<i2", "<i4", "<u4", "<i8"

// Writes a C-ordered array; the header is laid out as numpy.save lays it out.
void save_npy(const std::string& path, NpyType type, const std::vector<int64_t>& shape, const void* data);

// A memory-mapped .npy (throws UserError naming the file when it is not a C-ordered array of a
// supported type), or the same array held in memory.
class NpyArray {
 public:
  NpyArray() = default;
  explicit NpyArray(const std::string& path);
  NpyArray(NpyType type, std::vector<int64_t> shape, std::vector<char> bytes);
  NpyType type() const { return type_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  int64_t numel() const;
  const char* data() const { return data_; }
  // Element i of the flattened array, widened to int64.
  int64_t at(int64_t i) const;

 private:
  MappedFile file_;
  std::vector<char> bytes_;  // when held in memory
  NpyType type_ = NpyType::Int64;
  std::vector<int64_t> shape_;
  const char* data_ = nullptr;
};

}  // namespace fp8tron::data
