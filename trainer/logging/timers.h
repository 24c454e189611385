// Megatron-style named timers (--timing-log-level): each has a level; timers above the
// configured level cost nothing. Enabled timers synchronize the device around their interval so
// GPU work is measured, not its launch.
#pragma once
#include <chrono>
#include <functional>
#include <map>
#include <string>

namespace fp8tron {

class Timers {
 public:
  Timers(int log_level, std::function<void()> synchronize) : level_(log_level), sync_(std::move(synchronize)) {}

  void start(const std::string& name, int level) {
    if (level > level_) return;
    sync_();
    starts_[name] = Clock::now();
  }
  void stop(const std::string& name, int level) {
    if (level > level_) return;
    sync_();
    elapsed_ms_[name] += std::chrono::duration<double, std::milli>(Clock::now() - starts_[name]).count();
  }
  // Adds a duration measured elsewhere (no synchronization), e.g. the exposed communication that
  // parallel/overlap/comm_timer.h accumulates over a step.
  void add(const std::string& name, int level, double ms) {
    if (level > level_) return;
    elapsed_ms_[name] += ms;
  }
  bool enabled(int level) const { return level <= level_; }
  // Megatron's "(min, max) time across ranks (ms):" block, averaged over `normalizer` iterations;
  // resets the accumulated times. Empty when nothing was timed.
  std::string report(double normalizer) {
    if (elapsed_ms_.empty()) return "";
    std::string out = "(min, max) time across ranks (ms):";
    for (const auto& [name, ms] : elapsed_ms_) {
      const double v = ms / normalizer;
      std::string dots(name.size() < 48 ? 48 - name.size() : 1, '.');
      char line[160];
      std::snprintf(line, sizeof line, "\n    %s %s: (%.2f, %.2f)", name.c_str(), dots.c_str(), v, v);
      out += line;
    }
    elapsed_ms_.clear();
    return out;
  }

 private:
  using Clock = std::chrono::steady_clock;
  int level_;
  std::function<void()> sync_;
  std::map<std::string, Clock::time_point> starts_;
  std::map<std::string, double> elapsed_ms_;
};

}  // namespace fp8tron
