// The CRC-32 that a zip archive stores for each entry, and the check of an entry's bytes against
// it. torch.save archives (Megatron's legacy model_optim_rng.pt, the objects inside .distcp files)
// carry one per entry, but LibTorch's reader does not check them (its zip library is built without
// the check), so a flipped byte inside a tensor would load as a silently wrong value.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <string>

namespace fp8tron::checkpoint::megatron {

// The zip CRC-32 (IEEE 802.3 polynomial, as zlib's crc32) of `size` bytes, continued from `crc`.
uint32_t crc32(const void* data, size_t size, uint32_t crc = 0);

// The CRC-32 of bytes A followed by bytes B, from crc32(A), crc32(B) and B's length.
uint32_t crc32_combine(uint32_t crc_a, uint32_t crc_b, uint64_t length_b);

// An entry's CRC-32 checked from ranges of it read in any order: each range's CRC is kept,
// ranges that meet are joined (crc32_combine), and once they cover the entry the result is
// compared with the stored CRC. A range overlapping one already counted is not counted again.
class EntryCrcCheck {
 public:
  EntryCrcCheck(uint32_t stored_crc, int64_t entry_bytes) : stored_(stored_crc), bytes_(entry_bytes) {}
  // Counts bytes [begin, begin + n) of the entry; false when they complete the entry and its CRC-32
  // is not the stored one.
  bool add(int64_t begin, const void* bytes, int64_t n);

 private:
  struct Range {
    int64_t end;
    uint32_t crc;
  };
  uint32_t stored_;
  int64_t bytes_;
  std::map<int64_t, Range> ranges_;  // by first byte, disjoint, none adjacent to another
};

// Each entry's stored CRC-32 by its name without the archive's top folder ("data.pkl",
// "data/0"), read from the zip central directory (zip64 included). `read(offset, size)` returns
// that many bytes of the archive of `archive_size` bytes (fewer only past its end).
// DamagedCheckpoint naming `source` when the directory cannot be read.
std::map<std::string, uint32_t> zip_entry_crcs(uint64_t archive_size,
                                               const std::function<std::string(uint64_t, size_t)>& read,
                                               const std::string& source);

}  // namespace fp8tron::checkpoint::megatron
