// Checksums of checkpoint tensors: XXH3, 64 bits (xxHash, from Debian's libxxhash-dev). Fast
// enough (tens of GB/s) to hash every stored tensor while it is written and again when it is read,
// so a flipped byte or a truncated copy is named on load instead of turning into NaNs later.
// Torch-free.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

namespace fp8tron::checkpoint {

uint64_t checksum64(const void* data, size_t n);

// The same checksum over bytes that arrive in pieces.
class Checksum64 {
 public:
  Checksum64();
  ~Checksum64();
  Checksum64(const Checksum64&) = delete;
  Checksum64& operator=(const Checksum64&) = delete;
  void update(const void* data, size_t n);
  uint64_t digest() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// 16 lower-case hex digits, and back (nullopt unless exactly that).
std::string checksum_hex(uint64_t checksum);
std::optional<uint64_t> parse_checksum_hex(std::string_view text);

}  // namespace fp8tron::checkpoint
