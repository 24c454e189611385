#include "data/npy_file.h"

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "core/error.h"
#include "core/text.h"

namespace fp8tron::data {

int npy_type_size(NpyType type) {
  switch (type) {
    case NpyType::Int16: return 2;
    case NpyType::Int32: case NpyType::UInt32: return 4;
    case NpyType::Int64: return 8;
  }
  return 0;
}

const char* npy_descr(NpyType type) {
  switch (type) {
    case NpyType::Int16: return "<i2";
    case NpyType::Int32: return "<i4";
    case NpyType::UInt32: return "<u4";
    case NpyType::Int64: return "<i8";
  }
  return "";
}

namespace {

constexpr char kMagic[] = "\x93NUMPY";

std::string shape_repr(const std::vector<int64_t>& shape) {
  if (shape.size() == 1) return "(" + std::to_string(shape[0]) + ",)";  // numpy: "(5,)", "(5, 2)"
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + ")";
}

// The header dict padded with spaces so that the data starts at a multiple of 64 bytes; numpy
// also reserves room for the first dimension to grow to 21 digits (so arrays can be appended).
std::string make_header(NpyType type, const std::vector<int64_t>& shape) {
  std::string dict = strprintf("{'descr': '%s', 'fortran_order': False, 'shape': %s, }", npy_descr(type),
                               shape_repr(shape).c_str());
  if (!shape.empty()) dict += std::string(21 - std::to_string(shape[0]).size(), ' ');
  const size_t unpadded = 6 + 2 + 2 + dict.size() + 1;  // magic, version, length, dict, '\n'
  dict += std::string((64 - unpadded % 64) % 64, ' ') + "\n";
  std::string header(kMagic, 6);
  header += '\x01';
  header += '\x00';
  header += char(dict.size() & 0xff);
  header += char(dict.size() >> 8);
  return header + dict;
}

[[noreturn]] void bad_file(const std::string& path, const std::string& why) {
  throw UserError(strprintf("%s is not a usable index cache file (%s): delete it so it is rebuilt",
                            path.c_str(), why.c_str()));
}

// Parses "(a,)" / "(a, b)" into dimensions.
std::vector<int64_t> parse_shape(const std::string& dict, const std::string& path) {
  const size_t key = dict.find("'shape':");
  if (key == std::string::npos) bad_file(path, "no shape");
  const size_t open = dict.find('(', key), close = dict.find(')', key);
  if (open == std::string::npos || close == std::string::npos) bad_file(path, "bad shape");
  std::vector<int64_t> shape;
  const char* p = dict.c_str() + open + 1;
  const char* end = dict.c_str() + close;
  while (p < end) {
    while (p < end && (*p == ' ' || *p == ',')) ++p;
    if (p >= end) break;
    char* next = nullptr;
    const long long v = std::strtoll(p, &next, 10);
    if (next == p || v < 0) bad_file(path, "bad shape");
    shape.push_back(v);
    p = next;
  }
  return shape;
}

}  // namespace

void save_npy(const std::string& path, NpyType type, const std::vector<int64_t>& shape, const void* data) {
  const std::string header = make_header(type, shape);
  int64_t count = 1;
  for (int64_t d : shape) count *= d;
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) throw UserError(strprintf("cannot create %s: %s", path.c_str(), std::strerror(errno)));
  const size_t bytes = size_t(count) * npy_type_size(type);
  bool ok = std::fwrite(header.data(), 1, header.size(), f) == header.size();
  ok = ok && (bytes == 0 || std::fwrite(data, 1, bytes, f) == bytes);
  ok = (std::fclose(f) == 0) && ok;
  if (!ok) throw UserError(strprintf("cannot write %s: %s", path.c_str(), std::strerror(errno)));
}

NpyArray::NpyArray(const std::string& path) : file_(path) {
  const char* p = file_.data();
  const uint64_t size = file_.size();
  if (size < 10 || std::memcmp(p, kMagic, 6) != 0) bad_file(path, "bad magic");
  if (p[6] != 1) bad_file(path, "unsupported .npy version");
  const size_t header_len = uint8_t(p[8]) | size_t(uint8_t(p[9])) << 8;
  if (10 + header_len > size) bad_file(path, "truncated header");
  const std::string dict(p + 10, header_len);
  if (dict.find("'fortran_order': False") == std::string::npos) bad_file(path, "not C-ordered");
  bool found = false;
  for (NpyType t : {NpyType::Int16, NpyType::Int32, NpyType::UInt32, NpyType::Int64}) {
    if (dict.find(strprintf("'descr': '%s'", npy_descr(t))) != std::string::npos) {
      type_ = t;
      found = true;
    }
  }
  if (!found) bad_file(path, "unsupported dtype");
  shape_ = parse_shape(dict, path);
  data_ = p + 10 + header_len;
  if (10 + header_len + uint64_t(numel()) * npy_type_size(type_) != size) bad_file(path, "size does not match shape");
}

NpyArray::NpyArray(NpyType type, std::vector<int64_t> shape, std::vector<char> bytes)
    : bytes_(std::move(bytes)), type_(type), shape_(std::move(shape)), data_(bytes_.data()) {
  FP8TRON_CHECK(int64_t(bytes_.size()) == numel() * npy_type_size(type_), "array bytes do not match its shape");
}

int64_t NpyArray::numel() const {
  int64_t n = 1;
  for (int64_t d : shape_) n *= d;
  return n;
}

int64_t NpyArray::at(int64_t i) const {
  switch (type_) {
    case NpyType::Int16: { int16_t v; std::memcpy(&v, data_ + 2 * i, 2); return v; }
    case NpyType::Int32: { int32_t v; std::memcpy(&v, data_ + 4 * i, 4); return v; }
    case NpyType::UInt32: { uint32_t v; std::memcpy(&v, data_ + 4 * i, 4); return v; }
    case NpyType::Int64: { int64_t v; std::memcpy(&v, data_ + 8 * i, 8); return v; }
  }
  return 0;
}

}  // namespace fp8tron::data
