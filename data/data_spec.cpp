#include "data/data_spec.h"

#include <cctype>
#include <cmath>
#include <cstdlib>

#include "core/error.h"
#include "core/text.h"

namespace fp8tron::data {

const char* split_name(Split split) {
  switch (split) {
    case Split::Train: return "train";
    case Split::Valid: return "valid";
    case Split::Test: return "test";
  }
  return "?";
}

namespace {

// numpy's pairwise_sum for float64: plain loop below 8 elements, 8 interleaved accumulators up to
// 128, recursive halves above.
double pairwise_sum(const double* a, size_t n) {
  if (n < 8) {
    double res = 0.;
    for (size_t i = 0; i < n; ++i) res += a[i];
    return res;
  }
  if (n <= 128) {
    double r[8];
    for (int j = 0; j < 8; ++j) r[j] = a[j];
    size_t i = 8;
    for (; i < n - (n % 8); i += 8)
      for (int j = 0; j < 8; ++j) r[j] += a[i + j];
    double res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
    for (; i < n; ++i) res += a[i];
    return res;
  }
  size_t n2 = n / 2;
  n2 -= n2 % 8;
  return pairwise_sum(a, n2) + pairwise_sum(a + n2, n - n2);
}

// Python's float() on a whole token, without exceptions: nullopt when it is not a number.
std::optional<double> parse_float(const std::string& s) {
  if (s.empty()) return std::nullopt;
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  while (end && (*end == ' ' || *end == '\t')) ++end;
  if (end == s.c_str() || *end != '\0') return std::nullopt;
  return v;
}

std::string strip(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t\n\r\f\v"), e = s.find_last_not_of(" \t\n\r\f\v");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

}  // namespace

double numpy_sum(const std::vector<double>& values) { return 0.0 + pairwise_sum(values.data(), values.size()); }

std::vector<double> normalize(const std::vector<double>& weights) {
  const double sum = numpy_sum(weights);
  std::vector<double> out;
  for (double w : weights) out.push_back(w / sum);
  return out;
}

std::vector<double> parse_split(const std::string& split) {
  std::vector<double> parts;
  for (size_t i = 0; i < split.size();) {
    if (!(std::isdigit((unsigned char)split[i]) || split[i] == '.')) { ++i; continue; }
    size_t j = i;
    while (j < split.size() && (std::isdigit((unsigned char)split[j]) || split[j] == '.')) ++j;
    const auto v = parse_float(split.substr(i, j - i));
    if (!v) throw UserError(strprintf("--split %s: '%s' is not a number", split.c_str(), split.substr(i, j - i).c_str()));
    parts.push_back(*v);
    i = j;
  }
  if (parts.size() > 3)
    throw UserError(strprintf("--split %s has %zu parts; give at most three (train,valid,test), e.g. 969,30,1",
                              split.c_str(), parts.size()));
  parts.resize(3, 0.0);
  if (numpy_sum(parts) <= 0)
    throw UserError(strprintf("--split %s gives nothing to any split; e.g. 969,30,1", split.c_str()));
  return normalize(parts);
}

std::array<SplitRange, kNumSplits> split_matrix(const std::vector<double>& fractions) {
  std::array<SplitRange, kNumSplits> matrix;
  double begin = 0;
  for (int i = 0; i < kNumSplits; ++i) {
    const double end = begin + fractions[i];  // cumulative sums, added in the same order as Megatron
    if (end > begin) matrix[i] = std::make_pair(begin, end);
    begin = end;
  }
  return matrix;
}

std::pair<int64_t, int64_t> sequence_range(const std::pair<double, double>& range, int64_t num_sequences) {
  // std::nearbyint rounds half to even under the default rounding mode, as Python's round().
  return {int64_t(std::nearbyint(range.first * double(num_sequences))),
          int64_t(std::nearbyint(range.second * double(num_sequences)))};
}

Blend parse_blend(const std::vector<std::string>& args) {
  Blend blend;
  if (args.empty()) throw UserError("--data-path needs at least one dataset prefix");
  bool weighted = args.size() % 2 == 0;
  std::vector<double> weights;
  int parsed = 0;
  if (weighted) {
    for (size_t i = 0; i < args.size(); i += 2) {
      const auto w = parse_float(strip(args[i]));
      if (w) { weights.push_back(*w); ++parsed; }
    }
    if (parsed != 0 && parsed != int(args.size() / 2))
      throw UserError(strprintf("--data-path %s: mixes weights and prefixes; give either prefixes only or "
                                "weight/prefix pairs such as 0.3 a 0.7 b", join(args, " ").c_str()));
    weighted = parsed != 0;
  }
  for (size_t i = weighted ? 1 : 0; i < args.size(); i += weighted ? 2 : 1) blend.prefixes.push_back(strip(args[i]));
  if (weighted) {
    for (size_t i = 0; i < weights.size(); ++i)
      if (!(weights[i] > 0) || !std::isfinite(weights[i]))
        throw UserError(strprintf("--data-path: the weight of %s is %g; weights must be positive numbers",
                                  blend.prefixes[i].c_str(), weights[i]));
    blend.weights = weights;
  }
  return blend;
}

std::vector<int64_t> samples_per_dataset(const std::vector<double>& normalized_weights, int64_t size, double surplus) {
  std::vector<int64_t> out;
  for (double w : normalized_weights)
    out.push_back(int64_t(std::ceil(std::ceil(double(size) * w) * (1.0 + surplus))));
  return out;
}

}  // namespace fp8tron::data
