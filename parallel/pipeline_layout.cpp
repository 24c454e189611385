#include "parallel/pipeline_layout.h"

#include <algorithm>
#include <cctype>

#include "core/error.h"
#include "core/text.h"

namespace fp8tron {
namespace {

// One left-to-right pass replacing "(X)*n" (X without ')') by X repeated n times.
std::string unroll_groups(const std::string& s) {
  std::string out;
  size_t i = 0;
  while (i < s.size()) {
    if (s[i] == '(') {
      const size_t close = s.find(')', i + 1);
      if (close != std::string::npos && close > i + 1 && close + 2 < s.size() + 1 && s.compare(close + 1, 1, "*") == 0) {
        size_t j = close + 2;
        while (j < s.size() && std::isdigit(static_cast<unsigned char>(s[j]))) ++j;
        if (j > close + 2) {
          const std::string body = s.substr(i + 1, close - i - 1);
          for (long n = std::stol(s.substr(close + 2, j - close - 2)); n > 0; --n) out += body;
          i = j;
          continue;
        }
      }
    }
    out += s[i++];
  }
  return out;
}

// One left-to-right pass replacing "c*n" by c repeated n times.
std::string unroll_chars(const std::string& s) {
  std::string out;
  size_t i = 0;
  while (i < s.size()) {
    if (i + 2 < s.size() + 1 && i + 1 < s.size() && s[i + 1] == '*') {
      size_t j = i + 2;
      while (j < s.size() && std::isdigit(static_cast<unsigned char>(s[j]))) ++j;
      if (j > i + 2) {
        out.append(size_t(std::stol(s.substr(i + 2, j - i - 2))), s[i]);
        i = j;
        continue;
      }
    }
    out += s[i++];
  }
  return out;
}

}  // namespace

std::vector<std::string> parse_pipeline_layout(const std::string& layout) {
  std::string s = layout;
  s.erase(std::remove(s.begin(), s.end(), ','), s.end());
  s = unroll_chars(unroll_groups(s));
  std::vector<std::string> stages(1);
  for (char c : s) {
    if (c == '|') {
      stages.emplace_back();
      continue;
    }
    if (c != 'E' && c != 't' && c != 'm' && c != 'L')
      throw UserError(strprintf("--pipeline-model-parallel-layout: invalid layer character '%c' in \"%s\" (known: E, t, m, L, "
                                "with | between stages)",
                                c, layout.c_str()));
    stages.back() += c;
  }
  return stages;
}

void validate_pipeline_layout(const std::vector<std::string>& stages, int64_t num_layers, int64_t mtp_layers, int pp) {
  const std::string flag = "--pipeline-model-parallel-layout: ";
  if (stages.size() % size_t(pp) != 0)
    throw UserError(flag + strprintf("%zu stages do not divide over --pipeline-model-parallel-size %d", stages.size(), pp));
  const int vpp = int(stages.size()) / pp;
  std::string flat;
  for (const auto& st : stages) flat += st;
  auto count = [&](char c) { return int64_t(std::count(flat.begin(), flat.end(), c)); };
  if (flat.empty() || flat.front() != 'E') throw UserError(flag + "the first layer must be the embedding E");
  if (flat.back() != 'L') throw UserError(flag + "the last layer must be the loss L");
  if (count('E') != 1) throw UserError(flag + "the embedding E must appear exactly once");
  if (count('L') != 1) throw UserError(flag + "the loss L must appear exactly once");
  if (count('t') != num_layers)
    throw UserError(flag + strprintf("it has %lld transformer layers t but --num-layers is %lld", (long long)count('t'),
                                     (long long)num_layers));
  if (count('m') != mtp_layers)
    throw UserError(flag + strprintf("it has %lld MTP layers m but --mtp-num-layers is %lld", (long long)count('m'),
                                     (long long)mtp_layers));
  const size_t first_m = flat.find('m');
  if (first_m != std::string::npos && flat.find('t', first_m) != std::string::npos)
    throw UserError(flag + "transformer layers t must come before the MTP layers m");
  for (int p = 0; p < pp; ++p)
    for (int v = 0; v < vpp; ++v) {
      const std::string& st = stages[size_t(v * pp + p)];
      const int64_t m = int64_t(std::count(st.begin(), st.end(), 'm'));
      if (m > 0 && v + 1 < vpp) throw UserError(flag + "MTP layers must be in a rank's last virtual stage");
      if (m > 0 && m != mtp_layers) throw UserError(flag + "all MTP layers must be in one stage");
    }
}

}  // namespace fp8tron
