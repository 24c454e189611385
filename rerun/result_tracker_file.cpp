#include "rerun/result_tracker_file.h"

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sys/time.h>

#include "core/error.h"
#include "core/log.h"
#include "core/text.h"

namespace fp8tron::rerun {
namespace {

// Python's datetime.now(): "2025-01-31 12:34:56.789012".
std::string now_text() {
  timeval tv{};
  gettimeofday(&tv, nullptr);
  std::tm local{};
  localtime_r(&tv.tv_sec, &local);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", &local);
  return strprintf("%s.%06ld", buf, long(tv.tv_usec));
}

std::string value_text(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return strprintf("%.9g", v);
}

// The statuses that count towards skipping: a result rejected with reruns disabled, or found
// reproducible by a re-run. Megatron writes them as the enum's value or its qualified name.
bool counts_towards_skipping(std::string status) {
  if (const size_t dot = status.rfind('.'); dot != std::string::npos) status = status.substr(dot + 1);
  for (auto& ch : status) ch = char(std::tolower(static_cast<unsigned char>(ch)));
  return status == "rerun_disabled" || status == "first_rerun_reproducible" || status == "second_rerun_reproducible";
}

}  // namespace

const char* validation_status_name(ValidationStatus s) {
  switch (s) {
    case ValidationStatus::kRerunDisabled: return "rerun_disabled";
    case ValidationStatus::kInitialRun: return "initial_run";
    case ValidationStatus::kFirstRerunNotReproducible: return "first_rerun_not_reproducible";
    case ValidationStatus::kFirstRerunReproducible: return "first_rerun_reproducible";
    case ValidationStatus::kSecondRerunNotReproducible: return "second_rerun_not_reproducible";
    case ValidationStatus::kSecondRerunReproducible: return "second_rerun_reproducible";
  }
  return "?";
}

void check_tracker_file_appendable(const std::string& path) {
  std::ofstream out(path, std::ios::app);
  if (!out)
    throw UserError("--result-rejected-tracker-filename " + path + ": cannot be appended to (" + std::strerror(errno) +
                    "); give a writable path");
}

void append_tracker_record(const std::string& path, const TrackerRecord& r) {
  const char* job = std::getenv("SLURM_JOBID");
  const std::string line = strprintf("ts=%s node=%s device=%s jobID=%s rank=%d iteration=%lld status=%s result=%s "
                                     "message='%s'\n",
                                     now_text().c_str(), r.node.c_str(), r.device.c_str(), job ? job : "N/A", r.rank,
                                     (long long)r.iteration, validation_status_name(r.status),
                                     value_text(r.result).c_str(), r.message.c_str());
  std::ofstream out(path, std::ios::app);
  out << line;
  out.flush();
  if (!out) log::error("could not log the rejected result to --result-rejected-tracker-filename " + path);
}

std::vector<int64_t> iterations_to_skip_from_tracker(const std::string& path, std::vector<int64_t>* ignored) {
  static const std::regex record(R"(ts=.+ node=.+ device=.+ jobID=(.+) rank=(.+) iteration=(.+) status=(.+) result=.+ message=.+)");
  std::set<int64_t> candidates, several_ranks;
  std::set<std::pair<int, int64_t>> seen;                      // (rank, iteration)
  std::map<std::string, std::map<int64_t, std::set<int>>> by_job;  // job -> iteration -> ranks
  std::ifstream in(path);
  if (!in) log::warning("could not read --result-rejected-tracker-filename " + path + ": no iterations to skip from it");
  std::string line;
  while (std::getline(in, line)) {
    std::smatch m;
    if (!std::regex_search(line, m, record)) continue;
    int rank = 0;
    int64_t iteration = 0;
    try {
      rank = std::stoi(m[2].str());
      iteration = std::stoll(m[3].str());
    } catch (const std::exception&) {
      log::warning("--result-rejected-tracker-filename " + path + ": skipping the malformed line '" + line + "'");
      continue;
    }
    if (!counts_towards_skipping(m[4].str())) continue;
    if (!seen.insert({rank, iteration}).second) candidates.insert(iteration);
    auto& ranks = by_job[m[1].str()][iteration];
    ranks.insert(rank);
    if (ranks.size() > 1) several_ranks.insert(iteration);
  }
  std::vector<int64_t> skip;
  for (int64_t it : candidates)
    if (!several_ranks.count(it)) skip.push_back(it);
  if (ignored) ignored->assign(several_ranks.begin(), several_ranks.end());
  return skip;
}

}  // namespace fp8tron::rerun
