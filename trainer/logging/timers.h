// Megatron-style named timers (--timing-log-level): each has a level; timers above the
// configured level cost nothing. Enabled timers synchronize the device around their interval so
// GPU work is measured, not its launch. The report gathers every rank's times and prints them in
// Megatron's --timing-log-option forms (minmax, max, all).
#pragma once
#include <chrono>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace fp8tron {

class Timers {
 public:
  Timers(int log_level, std::function<void()> synchronize) : level_(log_level), sync_(std::move(synchronize)) {}

  void start(const std::string& name, int level);
  void stop(const std::string& name, int level);
  // Adds a duration measured elsewhere (no synchronization), e.g. the exposed communication that
  // parallel/overlap/comm_timer.h accumulates over a step.
  void add(const std::string& name, int level, double ms) {
    if (level > level_) return;
    elapsed_ms_[name] += ms;
  }
  bool enabled(int level) const { return level <= level_; }
  // Adds to a counter (a quantity per iteration that is not a time, e.g. the bytes the MoE
  // dispatch all-to-all sent), reported by report_counts at the same levels as the timers.
  void add_count(const std::string& name, int level, double value) {
    if (level > level_) return;
    counts_[name] += value;
  }

  // Every rank's values of `mine` (world_size x mine.size(), rank-major); all ranks call it with the
  // same number of values.
  using GatherAllRanks = std::function<std::vector<double>(const std::vector<double>& mine)>;

  struct Report {
    std::string text;  // "" when nothing was timed on any rank
    std::vector<std::pair<std::string, double>> max_ms;  // per timer, the maximum over ranks (TensorBoard)
  };
  // The times accumulated since the last report, averaged over `normalizer` iterations, for the
  // timers in `names` (Megatron's log order; every rank passes the same list). A rank that did not
  // run a timer (a pipeline stage without a data loader, say) does not count towards its min/max,
  // as in Megatron. `option`: "minmax" ("(min, max) time across ranks (ms):"), "max" or "all"
  // (every rank's time). Resets the accumulated times.
  Report report(const std::vector<std::string>& names, double normalizer, const std::string& option,
                const GatherAllRanks& gather, int world_size);
  // The same for the counters in `names`, per iteration ("(min, max) bytes per iteration across
  // ranks:", integers; max_ms then holds the maxima).
  Report report_counts(const std::vector<std::string>& names, double normalizer, const std::string& option,
                       const GatherAllRanks& gather, int world_size);

 private:
  Report report_values(std::map<std::string, double>& values, const std::vector<std::string>& names, double normalizer,
                       const std::string& option, const GatherAllRanks& gather, int world_size, bool counts);
  using Clock = std::chrono::steady_clock;
  int level_;
  std::function<void()> sync_;
  std::map<std::string, Clock::time_point> starts_;
  std::map<std::string, double> elapsed_ms_;
  std::map<std::string, double> counts_;
};

}  // namespace fp8tron
