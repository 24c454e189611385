#include "trainer/logging/timers.h"

#include <algorithm>
#include <limits>

#include "core/text.h"

namespace fp8tron {
namespace {

// Megatron pads "<name> " with dots to 48 characters.
std::string padded(const std::string& name) {
  std::string s = name + " ";
  if (s.size() < 48) s.append(48 - s.size(), '.');
  return s;
}

}  // namespace

void Timers::start(const std::string& name, int level) {
  if (level > level_) return;
  sync_();
  starts_[name] = Clock::now();
}

void Timers::stop(const std::string& name, int level) {
  if (level > level_) return;
  sync_();
  elapsed_ms_[name] += std::chrono::duration<double, std::milli>(Clock::now() - starts_[name]).count();
}

Timers::Report Timers::report(const std::vector<std::string>& names, double normalizer, const std::string& option,
                              const GatherAllRanks& gather, int world_size) {
  return report_values(elapsed_ms_, names, normalizer, option, gather, world_size, false);
}

Timers::Report Timers::report_counts(const std::vector<std::string>& names, double normalizer, const std::string& option,
                                     const GatherAllRanks& gather, int world_size) {
  return report_values(counts_, names, normalizer, option, gather, world_size, true);
}

Timers::Report Timers::report_values(std::map<std::string, double>& values, const std::vector<std::string>& names,
                                     double normalizer, const std::string& option, const GatherAllRanks& gather,
                                     int world_size, bool counts) {
  std::vector<double> mine;
  for (const auto& n : names) {
    auto it = values.find(n);
    mine.push_back(it == values.end() ? 0.0 : it->second / normalizer);
  }
  values.clear();
  auto number = [counts](double v) { return counts ? strprintf("%.0f", v) : strprintf("%.2f", v); };
  const std::vector<double> all = world_size > 1 ? gather(mine) : mine;
  const size_t n = names.size();
  Report r;
  const bool every_rank = option == "all";
  std::string body;
  for (size_t i = 0; i < n; ++i) {
    double lo = std::numeric_limits<double>::infinity(), hi = 0;
    std::string ranks;
    for (int rank = 0; rank < world_size; ++rank) {
      const double v = all[size_t(rank) * n + i];
      if (v <= 0) continue;
      lo = std::min(lo, v);
      hi = std::max(hi, v);
      ranks += strprintf("\n     rank %2d: ", rank) + number(v);
    }
    if (hi <= 0) continue;  // no rank ran this timer
    r.max_ms.emplace_back(names[i], hi);
    if (every_rank)
      body += "\n  " + names[i] + ":" + ranks;
    else if (option == "max")
      body += strprintf("\n    %s: ", padded(names[i]).c_str()) + number(hi);
    else
      body += strprintf("\n    %s: (", padded(names[i]).c_str()) + number(lo) + ", " + number(hi) + ")";
  }
  if (r.max_ms.empty()) return r;
  const char* title = counts ? (every_rank ? "bytes per iteration across ranks:"
                                : option == "max" ? "max bytes per iteration across ranks:"
                                                  : "(min, max) bytes per iteration across ranks:")
                      : every_rank ? "times across ranks (ms):"
                      : option == "max" ? "max time across ranks (ms):" : "(min, max) time across ranks (ms):";
  r.text = title + body;
  return r;
}

}  // namespace fp8tron
