#include "trainer/cli/rerun_args.h"

#include <algorithm>

#include "core/error.h"
#include "core/text.h"
#include "rerun/result_tracker_file.h"

namespace fp8tron {
namespace {

std::string listed(const std::vector<int64_t>& v) {
  std::vector<std::string> parts;
  for (int64_t i : v) parts.push_back(std::to_string(i));
  return "[" + join(parts, ", ") + "]";
}

}  // namespace

RerunConfig build_rerun_config(const FlagValues& f, const NumericsChecks& checks, std::vector<std::string>& warnings) {
  RerunConfig r;
  const std::string mode = f.get_string("rerun-mode");  // the table checks the choices
  r.mode = mode == "disabled" ? RerunMode::kDisabled : mode == "report_stats" ? RerunMode::kReportStats
                                                                             : RerunMode::kValidateResults;
  r.error_injection_rate = f.get_int("error-injection-rate");
  if (r.error_injection_rate < 0)
    throw UserError(strprintf("--error-injection-rate %lld: must be 0 (no injection) or N >= 1 (one result validation "
                              "in N is rejected)",
                              (long long)r.error_injection_rate));
  const std::string type = f.get_string("error-injection-type");
  r.error_injection_type = type == "correct_result"     ? InjectedError::kCorrectResult
                           : type == "persistent_error" ? InjectedError::kPersistentError
                                                        : InjectedError::kTransientError;
  r.result_rejected_tracker_filename = f.get_string("result-rejected-tracker-filename");
  r.test_node_name = f.get_string("fp8tron-test-node-name");
  const bool validates = checks.nan_in_loss_and_grad || checks.spiky_loss || checks.large_grads;
  if (r.error_injection_rate > 0 && r.mode != RerunMode::kValidateResults)
    warnings.push_back("--error-injection-rate has no effect with --rerun-mode " + mode +
                       " (results are rejected by injection only while validating them, as in Megatron)");
  else if (r.error_injection_rate > 0 && !validates)
    warnings.push_back("--error-injection-rate has no effect: no result is validated (--no-check-for-nan-in-loss-and-grad "
                       "without --check-for-spiky-loss or --check-for-large-grads)");
  if (f.given("error-injection-type") && r.error_injection_rate == 0)
    warnings.push_back("--error-injection-type has no effect without --error-injection-rate");
  if (f.given("rerun-mode") && r.mode != RerunMode::kDisabled && !validates)
    warnings.push_back("--rerun-mode " + mode + " has no effect: no result is validated (--no-check-for-nan-in-loss-and-grad "
                       "without --check-for-spiky-loss or --check-for-large-grads)");
  return r;
}

std::vector<int64_t> build_iterations_to_skip(const FlagValues& f, std::vector<std::string>& notices) {
  std::vector<int64_t> skip;
  for (const std::string& text : f.get_list("iterations-to-skip")) {
    const int64_t it = std::stoll(text);  // the table checked it is an integer
    if (it < 1)
      throw UserError(strprintf("--iterations-to-skip %lld: iterations are numbered from 1", (long long)it));
    skip.push_back(it);
  }
  const std::string tracker = f.get_string("result-rejected-tracker-filename");
  if (!tracker.empty()) {
    std::vector<int64_t> ignored;
    const std::vector<int64_t> from_file = rerun::iterations_to_skip_from_tracker(tracker, &ignored);
    notices.push_back("Will skip these iterations from tracker file: " + listed(from_file));
    if (!ignored.empty())
      notices.push_back("Will not skip these iterations due to multiple rank errors: " + listed(ignored));
    skip.insert(skip.end(), from_file.begin(), from_file.end());
  }
  std::sort(skip.begin(), skip.end());
  skip.erase(std::unique(skip.begin(), skip.end()), skip.end());
  return skip;
}

}  // namespace fp8tron
