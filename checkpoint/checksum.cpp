#include "checkpoint/checksum.h"

// Header-only use of the installed xxHash: only this file sees it, nothing is linked.
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "core/error.h"

namespace fp8tron::checkpoint {

uint64_t checksum64(const void* data, size_t n) { return XXH3_64bits(data, n); }

struct Checksum64::State {
  XXH3_state_t state;
};

Checksum64::Checksum64() : state_(std::make_unique<State>()) {
  FP8TRON_CHECK(XXH3_64bits_reset(&state_->state) == XXH_OK, "XXH3 reset failed");
}

Checksum64::~Checksum64() = default;

void Checksum64::update(const void* data, size_t n) {
  if (n > 0) FP8TRON_CHECK(XXH3_64bits_update(&state_->state, data, n) == XXH_OK, "XXH3 update failed");
}

uint64_t Checksum64::digest() const { return XXH3_64bits_digest(&state_->state); }

std::string checksum_hex(uint64_t checksum) {
  static const char digits[] = "0123456789abcdef";
  std::string out(16, '0');
  for (int i = 15; i >= 0; --i, checksum >>= 4) out[size_t(i)] = digits[checksum & 15];
  return out;
}

std::optional<uint64_t> parse_checksum_hex(std::string_view text) {
  if (text.size() != 16) return std::nullopt;
  uint64_t v = 0;
  for (char c : text) {
    int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
    if (d < 0) return std::nullopt;
    v = v << 4 | uint64_t(d);
  }
  return v;
}

}  // namespace fp8tron::checkpoint
