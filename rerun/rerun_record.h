// What the rerun engine stores in the checkpoint it asks for when a rejected result was
// reproduced in place (Megatron's RerunStateMachine.state_dict in WILL_RERUN_FROM_CHECKPOINT), and
// what the restarted job reads back to re-run that iteration on other hardware.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace fp8tron::rerun {

// Where a rank runs: Megatron tells whether a restarted job landed on other hardware by the node
// name and the GPU index.
struct Hardware {
  std::string node;
  int device = -1;  // CUDA device index; -1: the CPU
  std::string device_text() const { return device < 0 ? "cpu" : std::to_string(device); }
  bool operator==(const Hardware&) const = default;
};

struct RerunRecord {
  std::string mode = "validate_results";
  int64_t iteration = 0;     // the iteration to re-run (1-indexed); the checkpoint is of iteration - 1
  std::string failed_call;   // the message of the validation call that rejected its result
  double initial_result = 0;  // that result (NaN and inf survive the checkpoint)
  int64_t error_injection_rate = 0;
  std::string error_injection_type;  // Megatron's name
  std::string injected_error;        // the injected error being diagnosed; "" when none
  // The ranks whose hardware the diagnosis is about, with where each ran: the injecting rank, or
  // (a real result: fp8tron validates global values, which any rank may have computed wrongly)
  // every rank.
  std::vector<std::pair<int, Hardware>> suspects;
  // Megatron's is_unexpectedly_large samples per context ("loss", "grads"): count, largest.
  std::map<std::string, std::pair<int64_t, double>> large_values;
  bool operator==(const RerunRecord&) const = default;
};

}  // namespace fp8tron::rerun
