#include "core/text.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <stdexcept>

#include "core/error.h"

namespace fp8tron {

void throw_internal_error(const char* file, int line, const char* func, const std::string& message) {
  throw std::logic_error(strprintf("%s:%d (%s): %s", file, line, func, message.c_str()));
}

std::string strprintf(const char* format, ...) {
  va_list args;
  va_start(args, format);
  va_list copy;
  va_copy(copy, args);
  int n = std::vsnprintf(nullptr, 0, format, copy);
  va_end(copy);
  std::string out(n > 0 ? size_t(n) : 0, '\0');
  if (n > 0) std::vsnprintf(out.data(), out.size() + 1, format, args);
  va_end(args);
  return out;
}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t sub = prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, sub});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::string closest_match(const std::string& word, const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_distance = SIZE_MAX;
  auto lower = [](std::string s) {
    for (auto& ch : s) ch = char(std::tolower(static_cast<unsigned char>(ch)));
    return s;
  };
  for (const auto& c : candidates) {
    size_t d = edit_distance(lower(word), lower(c));
    // A candidate that contains the word (e.g. "--layers" in "--num-layers") is a strong hint too.
    if (c.find(word) != std::string::npos && word.size() >= 4) d = std::min(d, c.size() - word.size());
    if (d < best_distance) { best_distance = d; best = c; }
  }
  // Accept up to about a third of the word's length in edits.
  return best_distance <= std::max<size_t>(2, word.size() / 3 + 1) ? best : "";
}

std::string join(const std::vector<std::string>& parts, const std::string& sep) {
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) out += (i ? sep : "") + parts[i];
  return out;
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::vector<std::string> parts;
  for (int64_t d : shape) parts.push_back(std::to_string(d));
  return "[" + join(parts, ", ") + "]";
}

std::string human_count(double n) {
  const char* units[] = {"", " K", " M", " B", " T"};
  int u = 0;
  while (std::abs(n) >= 1000.0 && u < 4) { n /= 1000.0; ++u; }
  return strprintf(u ? "%.2f%s" : "%.0f%s", n, units[u]);
}

std::string human_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024.0 && u < 4) { bytes /= 1024.0; ++u; }
  return strprintf("%.2f %s", bytes, units[u]);
}

}  // namespace fp8tron
