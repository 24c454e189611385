#include "core/log.h"

#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <mutex>
#include <set>

namespace fp8tron::log {
namespace {
int g_rank = 0;
bool g_all_ranks = false;
std::atomic<int> g_level{kInfo};

spdlog::logger& err() {
  static std::shared_ptr<spdlog::logger> logger = [] {
    auto l = spdlog::stderr_logger_mt("fp8tron-err");
    l->set_pattern("%v");
    l->flush_on(spdlog::level::warn);
    return l;
  }();
  return *logger;
}

spdlog::logger& out() {
  // Plain pattern: Megatron's lines carry their own timestamps where they want them.
  static std::shared_ptr<spdlog::logger> logger = [] {
    auto l = spdlog::stdout_logger_mt("fp8tron");
    l->set_pattern("%v");
    l->flush_on(spdlog::level::info);
    return l;
  }();
  return *logger;
}
}  // namespace

void init(int rank, bool all_ranks) {
  g_rank = rank;
  g_all_ranks = all_ranks;
}
int rank() { return g_rank; }
void set_level(int level) { g_level = level; }
int level() { return g_level; }
bool enabled(int record_level) { return record_level >= g_level; }

void print(const std::string& message) {
  if (g_rank == 0 || g_all_ranks) out().info(message);
}
void info(const std::string& message) {
  if (enabled(kInfo)) print(message);
}
void warning(const std::string& message) {
  if (!enabled(kWarning)) return;
  err().warn(g_rank == 0 ? "WARNING: " + message : "[rank " + std::to_string(g_rank) + "] WARNING: " + message);
}
void error(const std::string& message) {
  if (!enabled(kError)) return;
  err().error(g_rank == 0 ? "error: " + message : "[rank " + std::to_string(g_rank) + "] error: " + message);
}
void warning_once(const std::string& key, const std::string& message) {
  static std::mutex mutex;
  static std::set<std::string> seen;
  std::lock_guard<std::mutex> lock(mutex);
  if (seen.insert(key).second) warning(message);
}

}  // namespace fp8tron::log
