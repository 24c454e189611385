// --result-rejected-tracker-filename: Megatron's log of rejected results, one line appended per
// event by the rank that judged it,
//   ts=<time> node=<host> device=<gpu> jobID=<$SLURM_JOBID or N/A> rank=<r> iteration=<i>
//   status=<status> result=<value> message='<validation call>'
// and, when a job starts, the iterations to skip that the file's records name (Megatron adds them to
// --iterations-to-skip): an iteration rejected twice on the same rank with reruns disabled or
// found reproducible by a re-run, unless within one job more than one rank reported it.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace fp8tron::rerun {

// Megatron's RerunValidationStatus values.
enum class ValidationStatus {
  kRerunDisabled,
  kInitialRun,
  kFirstRerunNotReproducible,
  kFirstRerunReproducible,
  kSecondRerunNotReproducible,
  kSecondRerunReproducible,
};
const char* validation_status_name(ValidationStatus status);  // "rerun_disabled", ...

struct TrackerRecord {
  std::string node;
  std::string device;
  int rank = 0;
  int64_t iteration = 0;
  ValidationStatus status = ValidationStatus::kRerunDisabled;
  double result = 0;
  std::string message;
};

// UserError (naming the flag) when the file cannot be opened for appending.
void check_tracker_file_appendable(const std::string& path);
// Appends one line (the time and $SLURM_JOBID added); a failure is logged, not fatal (Megatron's).
void append_tracker_record(const std::string& path, const TrackerRecord& record);
// The iterations to skip that the file's records name, sorted; a missing or unreadable file names
// none (logged), as in Megatron. `ignored` (optional): iterations not skipped because several
// ranks of one job reported them.
std::vector<int64_t> iterations_to_skip_from_tracker(const std::string& path, std::vector<int64_t>* ignored = nullptr);

}  // namespace fp8tron::rerun
