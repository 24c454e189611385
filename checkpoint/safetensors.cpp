#include "checkpoint/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <memory>
#include <numeric>
#include <set>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/text.h"
#include "checkpoint/checksum.h"
#include "checkpoint/file_io.h"
#include "checkpoint/megatron/damage.h"

static_assert(std::endian::native == std::endian::little,
              "safetensors stores little-endian data; a big-endian host would need byte swaps");

namespace fp8tron::checkpoint {

namespace {

struct DTypeInfo {
  DType dtype;
  const char* name;
  size_t size;
};

constexpr DTypeInfo kDTypes[] = {
    {DType::F64, "F64", 8},         {DType::F32, "F32", 4},         {DType::F16, "F16", 2},
    {DType::BF16, "BF16", 2},       {DType::I64, "I64", 8},         {DType::I32, "I32", 4},
    {DType::I16, "I16", 2},         {DType::I8, "I8", 1},           {DType::U8, "U8", 1},
    {DType::BOOL, "BOOL", 1},       {DType::F8_E4M3, "F8_E4M3", 1}, {DType::F8_E5M2, "F8_E5M2", 1},
    {DType::U64, "U64", 8},         {DType::U32, "U32", 4},         {DType::U16, "U16", 2},
    {DType::F8_E8M0, "F8_E8M0", 1},
};

const DTypeInfo& info(DType dtype) {
  for (const auto& d : kDTypes)
    if (d.dtype == dtype) return d;
  FP8TRON_CHECK(false, "unknown dtype enum value " + std::to_string(int(dtype)));
}

// The reference implementation refuses headers above 100 MB; so do we (a corrupt length
// would otherwise make us allocate gigabytes).
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

// nlohmann's string escaping, which is JSON's; names must be valid UTF-8.
std::string json_string(const std::string& s, const char* what) {
  try {
    return nlohmann::json(s).dump();
  } catch (const nlohmann::json::exception&) {
    throw UserError(strprintf("%s '%s' is not valid UTF-8; safetensors headers are UTF-8 JSON",
                              what, s.c_str()));
  }
}

std::optional<uint64_t> checked_nbytes(const Shape& shape, DType dtype) {
  auto n = checked_numel(shape);
  if (!n) return std::nullopt;
  uint64_t bytes;
  if (__builtin_mul_overflow(uint64_t(*n), uint64_t(dtype_size(dtype)), &bytes)) return std::nullopt;
  return bytes;
}

}  // namespace

const char* dtype_name(DType dtype) { return info(dtype).name; }
size_t dtype_size(DType dtype) { return info(dtype).size; }

std::optional<DType> parse_dtype(std::string_view name) {
  for (const auto& d : kDTypes)
    if (name == d.name) return d.dtype;
  return std::nullopt;
}

std::vector<std::string> dtype_names() {
  std::vector<std::string> out;
  for (const auto& d : kDTypes) out.emplace_back(d.name);
  return out;
}

std::string shape_string(const Shape& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

std::optional<int64_t> checked_numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) return std::nullopt;
    if (__builtin_mul_overflow(n, d, &n) || n > (int64_t(1) << 62)) return std::nullopt;
  }
  return n;
}

// ---- writing -------------------------------------------------------------------------------

SafetensorsLayout plan_safetensors(const std::vector<TensorToWrite>& tensors,
                                   const std::map<std::string, std::string>& metadata) {
  SafetensorsLayout layout;
  std::set<std::string_view> seen;
  for (const auto& t : tensors) {
    if (t.name.empty()) throw UserError("a safetensors tensor name is empty; give every tensor a name");
    if (t.name == "__metadata__")
      throw UserError("'__metadata__' is reserved in safetensors headers and cannot name a tensor");
    if (!seen.insert(t.name).second)
      throw UserError(strprintf("tensor '%s' is written twice to one safetensors file; names must "
                                "be unique within a file", t.name.c_str()));
    if (!checked_nbytes(t.shape, t.dtype))
      throw UserError(strprintf("tensor '%s' has an invalid shape %s (negative or too large)",
                                t.name.c_str(), shape_string(t.shape).c_str()));
  }

  // Largest elements first, stable: every tensor starts at a multiple of its element size.
  layout.order.resize(tensors.size());
  std::iota(layout.order.begin(), layout.order.end(), size_t(0));
  std::stable_sort(layout.order.begin(), layout.order.end(), [&](size_t a, size_t b) {
    return dtype_size(tensors[a].dtype) > dtype_size(tensors[b].dtype);
  });

  std::string json = "{";
  bool first = true;
  if (!metadata.empty()) {
    json += "\"__metadata__\":{";
    bool first_md = true;
    for (const auto& [k, v] : metadata) {
      if (!first_md) json += ',';
      first_md = false;
      json += json_string(k, "metadata key") + ':' + json_string(v, "metadata value");
    }
    json += '}';
    first = false;
  }
  uint64_t offset = 0;
  for (size_t idx : layout.order) {
    const auto& t = tensors[idx];
    uint64_t nbytes = *checked_nbytes(t.shape, t.dtype);
    layout.begin.push_back(offset);
    layout.end.push_back(offset + nbytes);
    if (!first) json += ',';
    first = false;
    json += json_string(t.name, "tensor name");
    json += ":{\"dtype\":\"";
    json += dtype_name(t.dtype);
    json += "\",\"shape\":[";
    for (size_t i = 0; i < t.shape.size(); ++i) {
      if (i) json += ',';
      json += std::to_string(t.shape[i]);
    }
    json += "],\"data_offsets\":[" + std::to_string(offset) + ',' + std::to_string(offset + nbytes) + "]}";
    offset += nbytes;
  }
  json += '}';
  json.append((8 - json.size() % 8) % 8, ' ');
  layout.data_bytes = offset;

  uint64_t n = json.size();
  layout.header.resize(8);
  for (int i = 0; i < 8; ++i) layout.header[i] = char((n >> (8 * i)) & 0xff);
  layout.header += json;
  return layout;
}

namespace {

// Stages small pieces into one buffer and sends big host tensors straight to the file.
class StreamingWriter {
 public:
  StreamingWriter(FileWriter& file, const WriteOptions& options)
      : file_(file), options_(options), buffer_(new char[std::max<size_t>(options.buffer_bytes, 4096)]),
        capacity_(std::max<size_t>(options.buffer_bytes, 4096)) {}

  void append(const void* data, size_t n) {
    const char* p = static_cast<const char*>(data);
    if (n >= capacity_ / 2) {
      flush();
      // Direct write, in writeback-sized pieces when writeback overlaps with writing.
      const uint64_t piece = options_.fsync && options_.writeback_every > 0 ? options_.writeback_every : n;
      while (n > 0) {
        size_t chunk = size_t(std::min<uint64_t>(n, piece));
        emit(p, chunk);
        p += chunk;
        n -= chunk;
      }
      return;
    }
    while (n > 0) {
      size_t room = capacity_ - used_;
      size_t take = std::min(room, n);
      std::memcpy(buffer_.get() + used_, p, take);
      used_ += take;
      p += take;
      n -= take;
      if (used_ == capacity_) flush();
    }
  }

  // `sum` takes the bytes as they are filled in.
  void append_filled(const std::function<void(uint64_t, void*, size_t)>& fill, uint64_t nbytes, Checksum64* sum) {
    uint64_t offset = 0;
    while (offset < nbytes) {
      if (used_ == capacity_) flush();
      size_t take = size_t(std::min<uint64_t>(capacity_ - used_, nbytes - offset));
      fill(offset, buffer_.get() + used_, take);
      sum->update(buffer_.get() + used_, take);
      used_ += take;
      offset += take;
    }
  }

  void flush() {
    if (used_ == 0) return;
    emit(buffer_.get(), used_);
    used_ = 0;
  }

 private:
  void emit(const char* p, size_t n) {
    file_.write(p, n);
    if (options_.fsync && options_.writeback_every > 0) {
      uint64_t pending = file_.bytes_written() - writeback_started_;
      if (pending >= options_.writeback_every) {
        file_.start_writeback(writeback_started_, pending);
        writeback_started_ = file_.bytes_written();
      }
    }
  }

  FileWriter& file_;
  const WriteOptions& options_;
  std::unique_ptr<char[]> buffer_;
  size_t capacity_;
  size_t used_ = 0;
  uint64_t writeback_started_ = 0;
};

}  // namespace

WriteStats write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                             const std::map<std::string, std::string>& metadata,
                             const WriteOptions& options) {
  auto start = std::chrono::steady_clock::now();
  SafetensorsLayout layout = plan_safetensors(tensors, metadata);
  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto& t = tensors[i];
    if (!t.data && !t.fill && checked_nbytes(t.shape, t.dtype).value_or(0) > 0)
      throw UserError(strprintf("tensor '%s' for %s has neither data nor a fill function",
                                t.name.c_str(), path.c_str()));
  }
  const uint64_t total = layout.header.size() + layout.data_bytes;

  const std::string partial = path + ".partial";
  FileWriter file(partial, options.fault, path);
  if (options.reserve_space) file.reserve(total);
  std::vector<uint64_t> checksums(tensors.size(), checksum64(nullptr, 0));
  {
    StreamingWriter out(file, options);
    out.append(layout.header.data(), layout.header.size());
    for (size_t k = 0; k < layout.order.size(); ++k) {
      const auto& t = tensors[layout.order[k]];
      uint64_t nbytes = layout.end[k] - layout.begin[k];
      if (nbytes == 0) continue;
      if (t.data) {
        out.append(t.data, size_t(nbytes));
        checksums[layout.order[k]] = checksum64(t.data, size_t(nbytes));
      } else {
        Checksum64 sum;
        out.append_filled(t.fill, nbytes, &sum);
        checksums[layout.order[k]] = sum.digest();
      }
    }
    out.flush();
  }
  FP8TRON_CHECK(file.bytes_written() == total, "safetensors size mismatch for " + path);
  if (options.fsync) file.sync();
  file.close();
  if (::rename(partial.c_str(), path.c_str()) != 0) {
    int err = errno;
    ::unlink(partial.c_str());
    throw UserError(io_error_message("renaming into place", path, err));
  }
  if (options.fsync) {
    std::string parent = std::filesystem::path(path).parent_path().string();
    fsync_path(parent.empty() ? "." : parent);
  }
  WriteStats stats;
  stats.bytes = total;
  stats.checksums = std::move(checksums);
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return stats;
}

// ---- reading -------------------------------------------------------------------------------

ParsedSafetensors parse_safetensors(const std::byte* bytes, uint64_t size, const std::string& source) {
  const char* src = source.c_str();
  if (size < 8)
    throw DamagedCheckpoint(strprintf("%s is not a safetensors file: it has %llu bytes, fewer than the "
                              "8-byte header length (truncated copy?)",
                              src, (unsigned long long)size));
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t(uint8_t(bytes[i])) << (8 * i);
  if (n > kMaxHeaderBytes)
    throw DamagedCheckpoint(strprintf("%s is not a valid safetensors file: its header length %llu is over "
                              "the 100 MB limit (corrupt or not safetensors)",
                              src, (unsigned long long)n));
  if (n > size - 8)
    throw DamagedCheckpoint(strprintf("%s is truncated: its header needs %llu bytes but the file has only "
                              "%llu after the length (re-copy the file or use another checkpoint)",
                              src, (unsigned long long)n, (unsigned long long)(size - 8)));
  const char* header = reinterpret_cast<const char*>(bytes + 8);
  if (n < 2 || header[0] != '{')
    throw DamagedCheckpoint(strprintf("%s is not a safetensors file: its header starts with '%s', not '{'", src,
                                      escaped_bytes(std::string_view(header, size_t(std::min<uint64_t>(n, 16)))).c_str()));

  using ojson = nlohmann::ordered_json;
  // nlohmann keeps the last of duplicate keys silently; a repeated tensor name is corruption.
  std::string duplicate;
  std::set<std::string> names;
  ojson::parser_callback_t on_key = [&](int depth, ojson::parse_event_t event, ojson& parsed) {
    if (event == ojson::parse_event_t::key && depth == 1 && duplicate.empty() &&
        !names.insert(parsed.get<std::string>()).second)
      duplicate = parsed.get<std::string>();
    return true;
  };
  ojson root;
  try {
    root = ojson::parse(header, header + n, on_key);
  } catch (const nlohmann::json::exception& e) {
    // The parser quotes the bytes it stopped at: escaped, a damaged header prints no raw binary.
    throw DamagedCheckpoint(
        strprintf("%s has a corrupt safetensors header (%s)", src, escaped_parse_error(e.what()).c_str()));
  }
  if (!duplicate.empty())
    throw DamagedCheckpoint(strprintf("%s: tensor '%s' appears twice in the safetensors header (corrupt file)",
                              src, duplicate.c_str()));
  if (!root.is_object())
    throw DamagedCheckpoint(strprintf("%s: the safetensors header is not a JSON object", src));

  const uint64_t data_size = size - 8 - n;
  const std::byte* data = bytes + 8 + n;
  ParsedSafetensors out;
  for (auto it = root.begin(); it != root.end(); ++it) {
    const std::string& name = it.key();
    const ojson& entry = it.value();
    if (name == "__metadata__") {
      if (!entry.is_object())
        throw DamagedCheckpoint(strprintf("%s: '__metadata__' must be an object of strings", src));
      for (auto m = entry.begin(); m != entry.end(); ++m) {
        if (!m.value().is_string())
          throw DamagedCheckpoint(strprintf("%s: '__metadata__' value for '%s' is not a string",
                                    src, m.key().c_str()));
        out.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    const char* nm = name.c_str();
    if (!entry.is_object())
      throw DamagedCheckpoint(strprintf("%s: header entry for tensor '%s' is not an object", src, nm));
    auto field = [&](const char* key) -> const ojson& {
      auto f = entry.find(key);
      if (f == entry.end())
        throw DamagedCheckpoint(strprintf("%s: tensor '%s' has no '%s' in the header", src, nm, key));
      return *f;
    };
    const ojson& jd = field("dtype");
    if (!jd.is_string())
      throw DamagedCheckpoint(strprintf("%s: tensor '%s' has a non-string dtype", src, nm));
    auto dtype = parse_dtype(jd.get<std::string>());
    if (!dtype)
      throw DamagedCheckpoint(strprintf("%s: tensor '%s' has dtype '%s', which fp8tron does not read "
                                "(known: %s)", src, nm, jd.get<std::string>().c_str(),
                                join(dtype_names(), " ").c_str()));
    const ojson& js = field("shape");
    if (!js.is_array())
      throw DamagedCheckpoint(strprintf("%s: tensor '%s' has a shape that is not a list", src, nm));
    Shape shape;
    for (const auto& d : js) {
      if (!d.is_number_unsigned())
        throw DamagedCheckpoint(strprintf("%s: tensor '%s' has a shape entry %s that is not a "
                                  "non-negative integer", src, nm, d.dump().c_str()));
      if (d.get<uint64_t>() > uint64_t(INT64_MAX))
        throw DamagedCheckpoint(strprintf("%s: tensor '%s' has a dimension too large", src, nm));
      shape.push_back(d.get<int64_t>());
    }
    const ojson& jo = field("data_offsets");
    if (!jo.is_array() || jo.size() != 2 || !jo[0].is_number_unsigned() || !jo[1].is_number_unsigned())
      throw DamagedCheckpoint(strprintf("%s: tensor '%s' needs data_offsets [begin, end] of non-negative "
                                "integers", src, nm));
    uint64_t begin = jo[0].get<uint64_t>(), end = jo[1].get<uint64_t>();
    if (begin > end)
      throw DamagedCheckpoint(strprintf("%s: tensor '%s' has data_offsets [%llu, %llu] with begin after end",
                                src, nm, (unsigned long long)begin, (unsigned long long)end));
    if (end > data_size)
      throw DamagedCheckpoint(strprintf("%s is truncated or corrupt: tensor '%s' ends at data offset %llu "
                                "but the file holds %llu data bytes",
                                src, nm, (unsigned long long)end, (unsigned long long)data_size));
    auto nbytes = checked_nbytes(shape, *dtype);
    if (!nbytes || *nbytes != end - begin)
      throw DamagedCheckpoint(strprintf("%s: tensor '%s' is %s %s = %s bytes but its data_offsets span %llu",
                                src, nm, dtype_name(*dtype), shape_string(shape).c_str(),
                                nbytes ? std::to_string(*nbytes).c_str() : "too many",
                                (unsigned long long)(end - begin)));
    TensorView v;
    v.name = name;
    v.dtype = *dtype;
    v.shape = std::move(shape);
    v.data = data + begin;
    v.nbytes = end - begin;
    out.tensors.push_back(std::move(v));
  }

  // The data must be exactly tiled by the tensors, in some order: no gaps, no overlaps.
  std::stable_sort(out.tensors.begin(), out.tensors.end(), [](const TensorView& a, const TensorView& b) {
    return a.data < b.data || (a.data == b.data && a.nbytes < b.nbytes);
  });
  uint64_t expect = 0;
  for (const auto& t : out.tensors) {
    uint64_t begin = uint64_t(t.data - data);
    if (begin < expect)
      throw DamagedCheckpoint(strprintf("%s: tensor '%s' overlaps the tensor before it in the data "
                                "(data_offsets begin %llu < %llu); corrupt file",
                                src, t.name.c_str(), (unsigned long long)begin,
                                (unsigned long long)expect));
    if (begin > expect)
      throw DamagedCheckpoint(strprintf("%s: the data has a gap of %llu bytes before tensor '%s'; "
                                "safetensors data must be contiguous (corrupt file)",
                                src, (unsigned long long)(begin - expect), t.name.c_str()));
    expect = begin + t.nbytes;
  }
  if (expect != data_size)
    throw DamagedCheckpoint(strprintf("%s has %llu bytes after its last tensor; the file is corrupt or was "
                              "appended to", src, (unsigned long long)(data_size - expect)));
  return out;
}

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  SafetensorsFile f;
  f.path_ = path;
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw DamagedCheckpoint(read_error_message("opening", path, errno));
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    throw DamagedCheckpoint(read_error_message("reading the size of", path, err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw DamagedCheckpoint(strprintf("%s is not a regular file", path.c_str()));
  }
  f.size_ = uint64_t(st.st_size);
  if (f.size_ < 8) {
    ::close(fd);
    parse_safetensors(nullptr, f.size_, path);  // throws the "too short" error
  }
  void* map = ::mmap(nullptr, f.size_, PROT_READ, MAP_SHARED, fd, 0);
  int err = errno;
  ::close(fd);
  if (map == MAP_FAILED) throw DamagedCheckpoint(read_error_message("mapping", path, err));
  f.map_ = map;
  f.parsed_ = parse_safetensors(static_cast<const std::byte*>(map), f.size_, path);
  return f;
}

SafetensorsFile::SafetensorsFile(SafetensorsFile&& other) noexcept
    : path_(std::move(other.path_)), map_(other.map_), size_(other.size_),
      parsed_(std::move(other.parsed_)) {
  other.map_ = nullptr;
  other.size_ = 0;
}

SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&& other) noexcept {
  if (this != &other) {
    if (map_) ::munmap(map_, size_);
    path_ = std::move(other.path_);
    map_ = other.map_;
    size_ = other.size_;
    parsed_ = std::move(other.parsed_);
    other.map_ = nullptr;
    other.size_ = 0;
  }
  return *this;
}

SafetensorsFile::~SafetensorsFile() {
  if (map_) ::munmap(map_, size_);
}

const TensorView* SafetensorsFile::find(std::string_view name) const {
  for (const auto& t : parsed_.tensors)
    if (t.name == name) return &t;
  return nullptr;
}

const TensorView& SafetensorsFile::at(std::string_view name) const {
  if (const TensorView* t = find(name)) return *t;
  std::vector<std::string> names;
  for (const auto& t : parsed_.tensors) names.push_back(t.name);
  std::string hint = closest_match(std::string(name), names);
  throw UserError(strprintf("%s has no tensor '%.*s'%s", path_.c_str(), int(name.size()), name.data(),
                            hint.empty() ? "" : (" (did you mean '" + hint + "'?)").c_str()));
}

}  // namespace fp8tron::checkpoint
