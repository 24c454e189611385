// Megatron's rerun engine (its RerunStateMachineConfig): how the validated results of an
// iteration (the loss and the gradient norm, NumericsChecks) are judged, and the error injection
// its tests use. rerun/rerun_state_machine.h says what each mode does.
#pragma once
#include <cstdint>
#include <string>

namespace fp8tron {

// --rerun-mode
enum class RerunMode {
  kDisabled,         // judge the first result: a fatal one stops the run
  kValidateResults,  // re-run a rejected iteration in place (and from a checkpoint) to attribute it
  kReportStats,      // re-run every iteration once and report the relative differences
};

// --error-injection-type (Megatron's RerunDiagnostic)
enum class InjectedError { kCorrectResult, kTransientError, kPersistentError };

struct RerunConfig {
  RerunMode mode = RerunMode::kValidateResults;  // Megatron's default
  int64_t error_injection_rate = 0;               // one validation in N is rejected (0: never)
  InjectedError error_injection_type = InjectedError::kTransientError;
  std::string result_rejected_tracker_filename;   // append a line per rejected result ("": none)
  // Hidden test flag --fp8tron-test-node-name: the node name the rerun engine records and compares
  // instead of the host name, so one machine can play "another node" in a restarted job.
  std::string test_node_name;
};

// Megatron's flag values.
inline const char* rerun_mode_name(RerunMode mode) {
  switch (mode) {
    case RerunMode::kDisabled: return "disabled";
    case RerunMode::kValidateResults: return "validate_results";
    case RerunMode::kReportStats: return "report_stats";
  }
  return "?";
}
inline const char* injected_error_name(InjectedError type) {
  switch (type) {
    case InjectedError::kCorrectResult: return "correct_result";
    case InjectedError::kTransientError: return "transient_error";
    case InjectedError::kPersistentError: return "persistent_error";
  }
  return "?";
}

}  // namespace fp8tron
