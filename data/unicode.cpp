#include "data/unicode.h"

#include <algorithm>
#include <array>

namespace fp8tron::data {
namespace {

struct UnicodeRange {
  uint32_t lo, hi;
};
#include "data/unicode_tables.inc"

template <size_t N>
bool in_table(const UnicodeRange (&table)[N], uint32_t cp) {
  auto it = std::upper_bound(std::begin(table), std::end(table), cp,
                             [](uint32_t c, const UnicodeRange& r) { return c < r.lo; });
  return it != std::begin(table) && cp <= (it - 1)->hi;
}

CharClass classify_slow(uint32_t cp) {
  if (in_table(kLetterRanges, cp)) return CharClass::Letter;
  if (in_table(kNumberRanges, cp)) return CharClass::Number;
  if (in_table(kWhitespaceRanges, cp)) return CharClass::Space;
  return CharClass::Other;
}

// Latin-1 covers nearly every character of English text: a table lookup instead of a search.
const std::array<CharClass, 256> kLatin1 = [] {
  std::array<CharClass, 256> t{};
  for (uint32_t c = 0; c < 256; ++c) t[c] = classify_slow(c);
  return t;
}();

// Length of the valid UTF-8 sequence at s[i], or 0. Follows the Unicode table of well-formed
// byte sequences (no overlongs, no surrogates, nothing above U+10FFFF).
int valid_length(std::string_view s, size_t i, uint32_t* cp) {
  const auto b = [&](size_t k) { return uint8_t(s[i + k]); };
  const uint8_t c = b(0);
  const size_t left = s.size() - i;
  if (c < 0x80) { *cp = c; return 1; }
  if (c >= 0xC2 && c <= 0xDF) {
    if (left < 2 || (b(1) & 0xC0) != 0x80) return 0;
    *cp = (c & 0x1Fu) << 6 | (b(1) & 0x3Fu);
    return 2;
  }
  if (c >= 0xE0 && c <= 0xEF) {
    if (left < 3) return 0;
    const uint8_t lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
    if (b(1) < lo || b(1) > hi || (b(2) & 0xC0) != 0x80) return 0;
    *cp = (c & 0x0Fu) << 12 | (b(1) & 0x3Fu) << 6 | (b(2) & 0x3Fu);
    return 3;
  }
  if (c >= 0xF0 && c <= 0xF4) {
    if (left < 4) return 0;
    const uint8_t lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
    if (b(1) < lo || b(1) > hi || (b(2) & 0xC0) != 0x80 || (b(3) & 0xC0) != 0x80) return 0;
    *cp = (c & 0x07u) << 18 | (b(1) & 0x3Fu) << 12 | (b(2) & 0x3Fu) << 6 | (b(3) & 0x3Fu);
    return 4;
  }
  return 0;
}

// Length of the maximal prefix of a valid sequence at s[i] (at least 1): what Python replaces with
// a single U+FFFD.
int invalid_length(std::string_view s, size_t i) {
  const uint8_t c = uint8_t(s[i]);
  int need = c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 1;
  int n = 1;
  for (; n < need && i + n < s.size(); ++n) {
    const uint8_t x = uint8_t(s[i + n]);
    uint8_t lo = 0x80, hi = 0xBF;
    if (n == 1 && c == 0xE0) lo = 0xA0;
    if (n == 1 && c == 0xED) hi = 0x9F;
    if (n == 1 && c == 0xF0) lo = 0x90;
    if (n == 1 && c == 0xF4) hi = 0x8F;
    if (x < lo || x > hi) break;
  }
  return n;
}

}  // namespace

uint32_t decode_utf8(std::string_view s, size_t i, int* length) {
  uint32_t cp = 0;
  const int n = valid_length(s, i, &cp);
  if (n == 0) {
    *length = 1;
    return uint32_t(uint8_t(s[i])) | 0x80000000u;
  }
  *length = n;
  return cp;
}

CharClass char_class(uint32_t cp) {
  if (cp < 256) return kLatin1[cp];
  if (cp & 0x80000000u) return CharClass::Other;
  return classify_slow(cp);
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += char(cp);
  } else if (cp < 0x800) {
    out += char(0xC0 | cp >> 6);
    out += char(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += char(0xE0 | cp >> 12);
    out += char(0x80 | (cp >> 6 & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  } else {
    out += char(0xF0 | cp >> 18);
    out += char(0x80 | (cp >> 12 & 0x3F));
    out += char(0x80 | (cp >> 6 & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  }
}

std::string utf8_replace_invalid(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  for (size_t i = 0; i < bytes.size();) {
    uint32_t cp;
    const int n = valid_length(bytes, i, &cp);
    if (n > 0) {
      out.append(bytes.substr(i, size_t(n)));
      i += size_t(n);
    } else {
      out += "\xEF\xBF\xBD";
      i += size_t(invalid_length(bytes, i));
    }
  }
  return out;
}

}  // namespace fp8tron::data
