#include "checkpoint/megatron/zip_crc.h"

#include <array>
#include <cstring>
#include <iterator>

#include "checkpoint/megatron/damage.h"
#include "core/text.h"

namespace fp8tron::checkpoint::megatron {
namespace {

// Slicing-by-8 tables: table[k][b] is the CRC of byte b followed by k zero bytes.
using Tables = std::array<std::array<uint32_t, 256>, 8>;

Tables make_tables() {
  Tables t{};
  for (uint32_t b = 0; b < 256; ++b) {
    uint32_t c = b;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
    t[0][b] = c;
  }
  for (uint32_t b = 0; b < 256; ++b)
    for (int k = 1; k < 8; ++k) t[k][b] = (t[k - 1][b] >> 8) ^ t[0][t[k - 1][b] & 0xFF];
  return t;
}

// The product of two polynomials modulo the CRC-32 polynomial, both in the CRC's reflected form
// (bit 31 the coefficient of x^0, bit 0 that of x^31).
uint32_t multiply_mod_p(uint32_t a, uint32_t b) {
  uint32_t product = 0;
  for (uint32_t term = 1u << 31; term != 0; term >>= 1) {  // a's terms x^0, x^1, ...
    if (a & term) product ^= b;
    b = (b & 1) ? (b >> 1) ^ 0xEDB88320u : b >> 1;  // b times x
  }
  return product;
}

// x^n modulo the CRC-32 polynomial, by squaring.
uint32_t x_power_mod_p(uint64_t n) {
  uint32_t result = 1u << 31, square = 1u << 30;  // x^0, x^1
  for (; n != 0; n >>= 1) {
    if (n & 1) result = multiply_mod_p(result, square);
    square = multiply_mod_p(square, square);
  }
  return result;
}

uint16_t u16(const std::string& b, size_t at) {
  return uint16_t(uint8_t(b[at]) | uint8_t(b[at + 1]) << 8);
}
uint32_t u32(const std::string& b, size_t at) { return uint32_t(u16(b, at)) | uint32_t(u16(b, at + 2)) << 16; }
uint64_t u64(const std::string& b, size_t at) { return uint64_t(u32(b, at)) | uint64_t(u32(b, at + 4)) << 32; }

constexpr uint32_t kEndOfDirectory = 0x06054b50, kZip64Locator = 0x07064b50, kZip64End = 0x06064b50,
                   kDirectoryEntry = 0x02014b50;
constexpr size_t kEndSize = 22, kLocatorSize = 20, kEntrySize = 46;

}  // namespace

uint32_t crc32_combine(uint32_t crc_a, uint32_t crc_b, uint64_t length_b) {
  // Appending B's bytes multiplies A's CRC by x^(8 |B|); the CRC's pre- and post-inversion cancel.
  return multiply_mod_p(x_power_mod_p(8 * length_b), crc_a) ^ crc_b;
}

bool EntryCrcCheck::add(int64_t begin, const void* bytes, int64_t n) {
  const int64_t end = begin + n;
  if (n <= 0 || begin < 0 || end > bytes_) return true;
  auto next = ranges_.lower_bound(begin);
  if (next != ranges_.end() && next->first < end) return true;  // overlaps a counted range
  if (next != ranges_.begin() && std::prev(next)->second.end > begin) return true;
  Range range{end, crc32(bytes, size_t(n))};
  int64_t first = begin;
  if (next != ranges_.begin() && std::prev(next)->second.end == begin) {  // joins the range before
    auto before = std::prev(next);
    first = before->first;
    range.crc = crc32_combine(before->second.crc, range.crc, uint64_t(n));
    ranges_.erase(before);
  }
  if (next != ranges_.end() && next->first == end) {  // and the range after
    range.crc = crc32_combine(range.crc, next->second.crc, uint64_t(next->second.end - next->first));
    range.end = next->second.end;
    ranges_.erase(next);
  }
  ranges_[first] = range;
  return !(first == 0 && range.end == bytes_) || range.crc == stored_;
}

uint32_t crc32(const void* data, size_t size, uint32_t crc) {
  static const Tables t = make_tables();
  const auto* p = static_cast<const uint8_t*>(data);
  crc = ~crc;
  for (; size >= 8; size -= 8, p += 8) {
    uint32_t low;
    std::memcpy(&low, p, 4);  // little-endian hosts (x86-64, AArch64)
    low ^= crc;
    crc = t[7][low & 0xFF] ^ t[6][(low >> 8) & 0xFF] ^ t[5][(low >> 16) & 0xFF] ^ t[4][low >> 24] ^ t[3][p[4]] ^
          t[2][p[5]] ^ t[1][p[6]] ^ t[0][p[7]];
  }
  for (; size > 0; --size, ++p) crc = t[0][(crc ^ *p) & 0xFF] ^ (crc >> 8);
  return ~crc;
}

std::map<std::string, uint32_t> zip_entry_crcs(uint64_t archive_size,
                                               const std::function<std::string(uint64_t, size_t)>& read,
                                               const std::string& source) {
  const auto damaged = [&](const std::string& what) {
    return DamagedCheckpoint(source + ": its zip directory " + what +
                             "; the file is truncated or corrupted: copy it again from the run that saved it");
  };
  // The end-of-directory record closes the archive, followed by a comment of up to 64 KiB.
  const uint64_t tail_size = std::min<uint64_t>(archive_size, kEndSize + 65535);
  const std::string tail = read(archive_size - tail_size, size_t(tail_size));
  if (tail.size() != tail_size) throw damaged("cannot be read");
  size_t end = std::string::npos;
  for (size_t at = tail.size() >= kEndSize ? tail.size() - kEndSize + 1 : 0; at-- > 0;)
    if (u32(tail, at) == kEndOfDirectory) {
      end = at;
      break;
    }
  if (end == std::string::npos) throw damaged("has no end record");
  uint64_t entries = u16(tail, end + 10), directory_size = u32(tail, end + 12), directory_at = u32(tail, end + 16);
  const uint64_t end_at = archive_size - tail_size + end;
  if (entries == 0xFFFF || directory_size == 0xFFFFFFFF || directory_at == 0xFFFFFFFF) {
    // Zip64: a locator just before the end record points at the zip64 end record.
    if (end_at < kLocatorSize) throw damaged("lacks its zip64 locator");
    const std::string locator = read(end_at - kLocatorSize, kLocatorSize);
    if (locator.size() != kLocatorSize || u32(locator, 0) != kZip64Locator) throw damaged("lacks its zip64 locator");
    const std::string zip64 = read(u64(locator, 8), 56);
    if (zip64.size() != 56 || u32(zip64, 0) != kZip64End) throw damaged("has a damaged zip64 end record");
    entries = u64(zip64, 32), directory_size = u64(zip64, 40), directory_at = u64(zip64, 48);
  }
  if (directory_at + directory_size > archive_size) throw damaged("reaches past the end of the file");
  const std::string directory = read(directory_at, size_t(directory_size));
  if (directory.size() != directory_size) throw damaged("cannot be read");
  std::map<std::string, uint32_t> crcs;
  size_t at = 0;
  for (uint64_t i = 0; i < entries; ++i) {
    if (at + kEntrySize > directory.size() || u32(directory, at) != kDirectoryEntry)
      throw damaged(strprintf("has a damaged entry %llu", (unsigned long long)i));
    const size_t name_size = u16(directory, at + 28), extra = u16(directory, at + 30), comment = u16(directory, at + 32);
    if (at + kEntrySize + name_size > directory.size())
      throw damaged(strprintf("has a damaged entry %llu", (unsigned long long)i));
    std::string name = directory.substr(at + kEntrySize, name_size);
    const size_t slash = name.find('/');
    if (slash != std::string::npos) name = name.substr(slash + 1);  // torch.save's top folder
    crcs[name] = u32(directory, at + 16);
    at += kEntrySize + name_size + extra + comment;
  }
  return crcs;
}

}  // namespace fp8tron::checkpoint::megatron
