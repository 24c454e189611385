#include "rerun/determinism_stats.h"

#include <algorithm>
#include <numeric>

#include "core/text.h"

namespace fp8tron::rerun {
namespace {

// 12345678 -> "12,345,678" (Python's {:,}).
std::string grouped(int64_t n) {
  std::string digits = std::to_string(n), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

}  // namespace

void DeterminismStats::record(double d) {
  if (d == 0.0) {
    ++identical_;
    return;
  }
  if (samples_.size() < max_samples_) samples_.push_back(d);
  else samples_[next_ % max_samples_] = d;
  ++next_;
  max_ = std::max(max_, d);
}

std::string DeterminismStats::summary() const {
  if (samples_.empty()) return grouped(identical_) + " samples, all identical";
  std::vector<double> sorted = samples_;
  std::sort(sorted.begin(), sorted.end());
  const int64_t z = identical_, t = total();
  const double mean = std::accumulate(sorted.begin(), sorted.end(), 0.0) / double(t);
  // The p-quantile of all t samples, the z identical ones (zeros) first.
  auto quantile = [&](double p) {
    const int64_t i = int64_t(double(t) * p) - z;
    return i >= 0 ? strprintf("%.3E", sorted[size_t(i)]) : std::string("0.0");
  };
  return strprintf("%s/%s total/identical samples, rel. variability: avg= %.3E, p50= %s, p90= %s, p99= %s, p99.9= %s, "
                   "max: %.3E",
                   grouped(t).c_str(), grouped(z).c_str(), mean, quantile(0.5).c_str(), quantile(0.9).c_str(),
                   quantile(0.99).c_str(), quantile(0.999).c_str(), max_);
}

}  // namespace fp8tron::rerun
