// Megatron's RerunErrorInjector (--error-injection-rate, --error-injection-type): how the rerun
// engine is tested. One validation in `rate` (on some rank) is rejected whatever its value, and the
// comparisons of the re-runs that follow are answered as the injected diagnosis asks:
//   transient_error   the re-run in place differs (a transient fault of this GPU)
//   persistent_error  the re-run in place matches, the re-run from the checkpoint on another GPU
//                     differs (a persistent fault of the first GPU)
//   correct_result    both match (the result was right: a problem of the math or the data)
// Megatron draws from each rank's Python random state, seeded alike on the ranks of a pipeline
// stage, and the rank (draw + rank) % rate == 0 injects. fp8tron draws from one stream seeded by
// --seed on every rank, so every rank knows which rank injects without a collective.
#pragma once
#include <cstdint>
#include <optional>
#include <random>

#include "core/config/rerun_config.h"

namespace fp8tron::rerun {

class ErrorInjector {
 public:
  ErrorInjector(int64_t rate, InjectedError type, uint64_t seed);

  bool enabled() const { return rate_ > 0; }
  int64_t rate() const { return rate_; }
  InjectedError type() const { return type_; }
  // One validation call: the rank whose result is rejected by injection, or -1. No draw (and -1)
  // while an injected error's diagnosis is under way, as in Megatron.
  int draw(int world_size);
  // The injected error whose re-runs are under way (set by draw, cleared by the comparison that
  // completes its diagnosis, or by cancel()).
  std::optional<InjectedError> pending() const { return pending_; }
  // The draw rejected a call that a real rejection before it pre-empted: nothing was injected.
  void cancel() { pending_.reset(); }

  // Megatron's maybe_miscompare: the relative difference the comparison of a re-run reports while
  // an injected error is pending (`measured` otherwise). `in_place`: the first re-run (same GPU);
  // else the re-run from the checkpoint.
  double compare(double measured, bool in_place);

  // The state a checkpoint carries to the restarted job.
  void restore(int64_t rate, InjectedError type, std::optional<InjectedError> pending);

 private:
  int64_t rate_;
  InjectedError type_;
  std::optional<InjectedError> pending_;
  std::mt19937_64 stream_;
};

}  // namespace fp8tron::rerun
