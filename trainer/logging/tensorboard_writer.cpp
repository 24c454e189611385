#include "trainer/logging/tensorboard_writer.h"

#include <unistd.h>  // gethostname, getpid: part of the file name TensorBoard tools expect

#include <array>
#include <bit>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <system_error>

#include "core/error.h"
#include "core/text.h"

namespace fp8tron {
namespace {

// ---- CRC-32C: byte-at-a-time table over the reflected Castagnoli polynomial --------------------

constexpr std::array<uint32_t, 256> make_crc32c_table() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    table[i] = c;
  }
  return table;
}
constexpr std::array<uint32_t, 256> kCrc32cTable = make_crc32c_table();

// ---- Protobuf wire format, just the parts an Event needs ------------------------------------------

enum WireType : uint32_t { kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5 };

void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(char((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out.push_back(char(v));
}

// Little-endian regardless of the host, as both protobuf fixed fields and TFRecord framing require.
void put_fixed(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(char((v >> (8 * i)) & 0xFF));
}

void put_key(std::string& out, uint32_t field, WireType wire) { put_varint(out, (uint64_t(field) << 3) | wire); }

void put_bytes(std::string& out, uint32_t field, std::string_view bytes) {
  put_key(out, field, kLengthDelimited);
  put_varint(out, bytes.size());
  out.append(bytes);
}

uint64_t get_fixed(std::string_view in, size_t pos, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= uint64_t(uint8_t(in[pos + i])) << (8 * i);
  return v;
}

double wall_time_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// Event{ wall_time = 1 (double); step = 2 (int64); file_version = 3 (string); summary = 5 }.
std::string event_header(double wall_time, int64_t step) {
  std::string event;
  put_key(event, 1, kFixed64);
  put_fixed(event, std::bit_cast<uint64_t>(wall_time), 8);
  put_key(event, 2, kVarint);
  put_varint(event, uint64_t(step));  // int64, not sint64: negatives take ten bytes, as in protobuf
  return event;
}

// Cursor over one protobuf message. Any malformation is reported as a corrupt record of the file,
// since a CRC-valid record that does not parse is still unusable input.
class ProtoReader {
 public:
  ProtoReader(std::string_view data, const std::string& where) : data_(data), where_(where) {}

  bool done() const { return pos_ == data_.size(); }

  uint64_t varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (done()) fail("truncated varint");
      uint8_t b = uint8_t(data_[pos_++]);
      v |= uint64_t(b & 0x7F) << shift;
      if (!(b & 0x80)) return v;
    }
    fail("varint longer than 10 bytes");
  }

  uint64_t fixed(int bytes) {
    if (data_.size() - pos_ < size_t(bytes)) fail("truncated fixed-width field");
    uint64_t v = get_fixed(data_, pos_, bytes);
    pos_ += bytes;
    return v;
  }

  std::string_view bytes() {
    uint64_t n = varint();
    if (n > data_.size() - pos_) fail("length-delimited field runs past the end of its message");
    std::string_view out = data_.substr(pos_, n);
    pos_ += n;
    return out;
  }

  // Unknown fields (graph_def, tensor summaries, plugin metadata, ...) are skipped by wire type.
  void skip(uint32_t wire) {
    switch (wire) {
      case kVarint: varint(); break;
      case kFixed64: fixed(8); break;
      case kLengthDelimited: bytes(); break;
      case kFixed32: fixed(4); break;
      default: fail(strprintf("unsupported wire type %u", wire).c_str());  // groups are deprecated
    }
  }

  [[noreturn]] void fail(const char* what) const { throw UserError(where_ + ": " + what); }

 private:
  std::string_view data_;
  size_t pos_ = 0;
  const std::string& where_;
};

// Summary.Value{ tag = 1 (string); simple_value = 2 (float) }. Values without simple_value (images,
// histograms, tensors) are not scalars and are left out.
void decode_value(std::string_view data, const std::string& where, std::vector<ScalarEvent>& out) {
  ProtoReader r(data, where);
  std::string tag;
  bool has_value = false;
  float value = 0;
  while (!r.done()) {
    uint64_t key = r.varint();
    uint64_t field = key >> 3;
    uint32_t wire = uint32_t(key & 7);
    if (field == 1 && wire == kLengthDelimited) {
      tag = std::string(r.bytes());
    } else if (field == 2 && wire == kFixed32) {
      value = std::bit_cast<float>(uint32_t(r.fixed(4)));
      has_value = true;
    } else {
      r.skip(wire);
    }
  }
  if (has_value) out.push_back({tag, value, 0, 0});
}

// Protobuf fields may come in any order, so step and wall_time are filled in once the whole Event
// has been read.
void decode_event(std::string_view data, const std::string& where, std::vector<ScalarEvent>& out) {
  ProtoReader r(data, where);
  size_t first = out.size();
  double wall_time = 0;
  int64_t step = 0;
  while (!r.done()) {
    uint64_t key = r.varint();
    uint64_t field = key >> 3;
    uint32_t wire = uint32_t(key & 7);
    if (field == 1 && wire == kFixed64) {
      wall_time = std::bit_cast<double>(r.fixed(8));
    } else if (field == 2 && wire == kVarint) {
      step = int64_t(r.varint());
    } else if (field == 5 && wire == kLengthDelimited) {
      ProtoReader summary(r.bytes(), where);  // Summary{ repeated Value value = 1; }
      while (!summary.done()) {
        uint64_t skey = summary.varint();
        if ((skey >> 3) == 1 && (skey & 7) == kLengthDelimited) {
          decode_value(summary.bytes(), where, out);
        } else {
          summary.skip(uint32_t(skey & 7));
        }
      }
    } else {
      r.skip(wire);
    }
  }
  for (size_t i = first; i < out.size(); ++i) {
    out[i].step = step;
    out[i].wall_time = wall_time;
  }
}

}  // namespace

uint32_t crc32c(std::string_view bytes) {
  uint32_t c = ~0u;
  for (unsigned char b : bytes) c = kCrc32cTable[(c ^ b) & 0xFF] ^ (c >> 8);
  return ~c;
}

uint32_t masked_crc32c(std::string_view bytes) {
  uint32_t crc = crc32c(bytes);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

// ---- Writer -----------------------------------------------------------------------------------------

TensorBoardWriter::TensorBoardWriter(const std::string& log_dir) {
  std::error_code ec;
  std::filesystem::create_directories(log_dir, ec);
  if (!ec && !std::filesystem::is_directory(log_dir, ec) && !ec) {
    ec = std::make_error_code(std::errc::not_a_directory);
  }
  if (ec) {
    throw UserError(strprintf("cannot create TensorBoard directory '%s': %s", log_dir.c_str(),
                              ec.message().c_str()));
  }

  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) != 0 || host[0] == '\0') std::strcpy(host, "localhost");
  double now = wall_time_now();
  std::string base = strprintf("%s/events.out.tfevents.%lld.%s.%d", log_dir.c_str(),
                               static_cast<long long>(now), host, int(getpid()));

  // Open exclusively ("x") so that a second writer in the same second and process cannot truncate
  // the first one's file; it gets a numeric suffix instead, which TensorBoard also picks up.
  for (int attempt = 0; attempt < 1000 && !file_; ++attempt) {
    path_ = attempt == 0 ? base : strprintf("%s.%d", base.c_str(), attempt);
    file_ = std::fopen(path_.c_str(), "wbx");
    if (!file_ && errno != EEXIST) break;
  }
  if (!file_) {
    throw UserError(strprintf("cannot open a TensorBoard event file in '%s': %s", log_dir.c_str(),
                              std::strerror(errno)));
  }

  // TensorBoard identifies the format by this first record.
  std::string event = event_header(now, 0);
  put_bytes(event, 3, "brain.Event:2");
  write_record(event);
  flush();
}

TensorBoardWriter::~TensorBoardWriter() {
  // Destructors must not throw; a write error would already have surfaced from add_scalar/flush.
  if (file_) std::fclose(file_);  // fclose flushes
}

void TensorBoardWriter::add_scalar(const std::string& tag, double value, int64_t step) {
  std::string summary_value;
  put_bytes(summary_value, 1, tag);
  put_key(summary_value, 2, kFixed32);
  put_fixed(summary_value, std::bit_cast<uint32_t>(static_cast<float>(value)), 4);

  std::string summary;
  put_bytes(summary, 1, summary_value);

  std::string event = event_header(wall_time_now(), step);
  put_bytes(event, 5, summary);
  write_record(event);
}

void TensorBoardWriter::flush() {
  if (std::fflush(file_) != 0) {
    throw UserError(strprintf("cannot write TensorBoard event file '%s': %s", path_.c_str(),
                              std::strerror(errno)));
  }
}

// TFRecord framing: uint64 length, masked CRC of the length bytes, data, masked CRC of the data.
void TensorBoardWriter::write_record(const std::string& data) {
  std::string record;
  put_fixed(record, data.size(), 8);
  put_fixed(record, masked_crc32c(record), 4);
  record += data;
  put_fixed(record, masked_crc32c(data), 4);
  if (std::fwrite(record.data(), 1, record.size(), file_) != record.size()) {
    throw UserError(strprintf("cannot write TensorBoard event file '%s': %s", path_.c_str(),
                              std::strerror(errno)));
  }
}

// ---- Reader -----------------------------------------------------------------------------------------

std::vector<ScalarEvent> read_tensorboard_scalars(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UserError(strprintf("cannot open TensorBoard event file '%s'", path.c_str()));
  // Event files of scalars are small; reading the whole file keeps the bounds checks simple.
  std::string file((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::string_view all(file);

  std::vector<ScalarEvent> out;
  size_t pos = 0;
  for (size_t index = 0; pos < all.size(); ++index) {
    std::string where = strprintf("corrupt TensorBoard event file '%s', record %zu at byte %zu",
                                  path.c_str(), index, pos);
    if (all.size() - pos < 12) throw UserError(where + ": truncated record header");
    // Check the length's own CRC before trusting it to size anything.
    if (uint32_t(get_fixed(all, pos + 8, 4)) != masked_crc32c(all.substr(pos, 8))) {
      throw UserError(where + ": length CRC mismatch");
    }
    uint64_t length = get_fixed(all, pos, 8);
    size_t available = all.size() - pos - 12;
    if (available < 4 || length > available - 4) throw UserError(where + ": truncated record data");
    std::string_view data = all.substr(pos + 12, length);
    if (uint32_t(get_fixed(all, pos + 12 + length, 4)) != masked_crc32c(data)) {
      throw UserError(where + ": data CRC mismatch");
    }
    decode_event(data, where, out);
    pos += 12 + length + 4;
  }
  return out;
}

}  // namespace fp8tron
