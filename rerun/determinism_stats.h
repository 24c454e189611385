// --rerun-mode report_stats: the distribution of the relative differences between an iteration's
// result and its re-run's, per validation call (Megatron's QuickStats): identical samples are only
// counted; the others (up to 100,000, then the oldest are overwritten) give the mean over all
// samples, percentiles over all samples (the identical ones count as the lowest), and the maximum.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace fp8tron::rerun {

class DeterminismStats {
 public:
  explicit DeterminismStats(size_t max_samples = 100000) : max_samples_(max_samples) {}
  void record(double relative_difference);
  int64_t identical() const { return identical_; }
  int64_t total() const { return identical_ + int64_t(samples_.size()); }
  // Megatron's line: "T/Z total/identical samples, rel. variability: avg= .., p50= .., p90= ..,
  // p99= .., p99.9= .., max: .." or "Z samples, all identical".
  std::string summary() const;

 private:
  size_t max_samples_;
  std::vector<double> samples_;  // the non-zero differences (a ring once full)
  size_t next_ = 0;              // recorded non-zero differences (the ring's write position)
  int64_t identical_ = 0;
  double max_ = 0.0;
};

}  // namespace fp8tron::rerun
