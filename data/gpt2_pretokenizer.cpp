#include "data/gpt2_pretokenizer.h"

#include "data/unicode.h"

namespace fp8tron::data {
namespace {

struct Char {
  uint32_t cp;
  uint32_t offset;  // byte offset in the text
  CharClass cls;
};

// 's 't 'm 'd (2 characters) or 're 've 'll (3) at position i, else 0. Lower case only, as in
// the reference pattern.
int contraction_length(const std::vector<Char>& c, size_t i) {
  if (c[i].cp != '\'' || i + 1 >= c.size()) return 0;
  const uint32_t a = c[i + 1].cp;
  if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
  if (i + 2 >= c.size()) return 0;
  const uint32_t b = c[i + 2].cp;
  if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
  return 0;
}

}  // namespace

void gpt2_pretokenize(std::string_view text, std::vector<Piece>& out) {
  out.clear();
  thread_local std::vector<Char> chars;
  chars.clear();
  for (size_t i = 0; i < text.size();) {
    int len;
    const uint32_t cp = decode_utf8(text, i, &len);
    chars.push_back({cp, uint32_t(i), char_class(cp)});
    i += size_t(len);
  }
  const size_t n = chars.size();
  const auto offset = [&](size_t k) { return k < n ? chars[k].offset : uint32_t(text.size()); };
  const auto emit = [&](size_t b, size_t e) { out.push_back({offset(b), offset(e) - offset(b)}); };

  size_t i = 0;
  while (i < n) {
    if (const int len = contraction_length(chars, i)) {
      emit(i, i + size_t(len));
      i += size_t(len);
      continue;
    }
    // ` ?\p{L}+`, ` ?\p{N}+`, ` ?[^\s\p{L}\p{N}]+`: an optional ASCII space, then a run of one class.
    size_t start = i;
    if (chars[i].cp == ' ' && i + 1 < n && chars[i + 1].cls != CharClass::Space) start = i + 1;
    const CharClass cls = chars[start].cls;
    if (cls != CharClass::Space) {
      size_t end = start + 1;
      while (end < n && chars[end].cls == cls) ++end;
      emit(i, end);
      i = end;
      continue;
    }
    // Whitespace. `\s+(?!\S)` takes the run, but gives back its last character when a
    // non-space follows (so " word" keeps its space); a lone whitespace falls to `\s+`.
    size_t end = i + 1;
    while (end < n && chars[end].cls == CharClass::Space) ++end;
    if (end < n && end - i >= 2) --end;
    emit(i, end);
    i = end;
  }
}

}  // namespace fp8tron::data
