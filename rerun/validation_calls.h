// The results an iteration validates (Megatron's validate_result calls) and how two runs of one
// are compared.
//
// Megatron validates each rank's micro-batch losses in pretrain_gpt.py's loss_func (NaN, Inf,
// spiky) and each gradient bucket's local norm before the data-parallel reduction (NaN, Inf,
// large). fp8tron validates the iteration's loss (averaged over micro-batches and data-parallel
// ranks) and the global gradient norm, in the same order, once per run of the iteration. Both are
// results of collectives, so every rank holds the same bits and judges alike.
#pragma once
#include <string>
#include <vector>

#include "core/config/training_config.h"

namespace fp8tron::rerun {

enum class Subject { kLoss, kGradNorm };
enum class Rejection { kNan, kInf, kUnexpectedlyLarge };

struct ValidationCall {
  Subject subject = Subject::kLoss;
  Rejection rejection = Rejection::kNan;
  bool fatal = true;         // a confirmed rejection ends the run
  double tolerance = 0.0;    // the relative difference between two runs still counted as the same
  double factor = 0.0;       // kUnexpectedlyLarge: at least this many times the sampled largest
  std::string message;       // Megatron's message (names the call in logs, stats and checkpoints)
  const char* context() const { return subject == Subject::kLoss ? "loss" : "grads"; }
};

// The calls the enabled checks make, in Megatron's order: the loss's (forward), then the
// gradients' (backward).
std::vector<ValidationCall> validation_calls(const NumericsChecks& checks);

// Megatron's comparison of an initial result and a re-run's (_compare_floats): 0 when equal or
// both NaN; inf when only one is NaN or only one is infinite (or both are, with opposite signs);
// else |a - b| / ((a + b) / 2) in magnitude.
double relative_difference(double initial, double rerun);

// Whether `value` is rejected by `call` given the threshold of kUnexpectedlyLarge calls (inf while
// the largest value is still being sampled). The device evaluates the same rule in double, so
// both sides agree bit for bit.
bool rejects(const ValidationCall& call, double value, double large_threshold);

// Megatron's number of samples that set the largest value of a context.
inline constexpr int64_t kLargeValueSamples = 100;

}  // namespace fp8tron::rerun
