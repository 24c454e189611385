#include "checkpoint/fault_points.h"

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <atomic>
#include <mutex>

#include "core/error.h"
#include "core/text.h"

namespace fp8tron::checkpoint {
namespace {

std::atomic<bool> armed{false};
std::mutex mutex;
std::string armed_name;
int remaining_hits = 0;

}  // namespace

const std::vector<std::string>& fault_point_names() {
  static const std::vector<std::string> names = {
      "save:shard-written",        "save:metadata-written",     "commit:files-verified",
      "commit:files-synced",       "commit:old-copy-moved-aside", "commit:renamed-into-place",
      "commit:tracker-temp-written", "commit:tracker-committed", "commit:cleaned-up",
      "retention:renamed-aside",   "retention:removed"};
  return names;
}

void arm_fault_point(const std::string& spec) {
  const size_t at = spec.find('@');
  const std::string name = spec.substr(0, at);
  int hit = 1;
  if (at != std::string::npos) {
    char* end = nullptr;
    const long v = std::strtol(spec.c_str() + at + 1, &end, 10);
    if (*end != '\0' || v < 1) throw UserError("--fp8tron-test-kill-at " + spec + ": HIT after '@' must be a positive integer");
    hit = int(v);
  }
  const auto& names = fault_point_names();
  bool known = false;
  for (const auto& n : names) known = known || n == name;
  if (!known) throw UserError("--fp8tron-test-kill-at " + spec + ": unknown point; known points: " + join(names, ", "));
  std::lock_guard<std::mutex> lock(mutex);
  armed_name = name;
  remaining_hits = hit;
  armed = true;
}

void fault_point(const std::string& name) {
  if (!armed.load(std::memory_order_relaxed)) return;
  std::lock_guard<std::mutex> lock(mutex);
  if (name != armed_name || --remaining_hits > 0) return;
  std::fprintf(stderr, "fp8tron: test fault point '%s' reached: killing this process (SIGKILL)\n", name.c_str());
  std::fflush(stderr);
  std::fflush(stdout);
  std::raise(SIGKILL);
}

}  // namespace fp8tron::checkpoint
