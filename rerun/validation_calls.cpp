#include "rerun/validation_calls.h"

#include <cmath>
#include <limits>

namespace fp8tron::rerun {
namespace {

// Megatron's factors: SPIKY_LOSS_FACTOR (pretrain_gpt.py) and check_grads' threshold.
constexpr double kSpikyLossFactor = 10.0;
constexpr double kLargeGradsFactor = 10.0;
// Megatron's tolerances: the forward pass is deterministic; the backward may not be (e.g. flash
// attention's), hence 0.1% for the gradients.
constexpr double kLossTolerance = 0.0;
constexpr double kGradTolerance = 0.001;

ValidationCall call(Subject s, Rejection r, bool fatal, double factor, const char* message) {
  ValidationCall c;
  c.subject = s;
  c.rejection = r;
  c.fatal = fatal;
  c.tolerance = s == Subject::kLoss ? kLossTolerance : kGradTolerance;
  c.factor = factor;
  c.message = message;
  return c;
}

}  // namespace

std::vector<ValidationCall> validation_calls(const NumericsChecks& checks) {
  std::vector<ValidationCall> calls;
  if (checks.nan_in_loss_and_grad) {
    calls.push_back(call(Subject::kLoss, Rejection::kNan, true, 0, "found NaN in forward loss calculation"));
    calls.push_back(call(Subject::kLoss, Rejection::kInf, true, 0, "found Inf in forward loss calculation"));
  }
  if (checks.spiky_loss)
    calls.push_back(call(Subject::kLoss, Rejection::kUnexpectedlyLarge, false, kSpikyLossFactor, "Spiky loss"));
  if (checks.nan_in_loss_and_grad) {
    calls.push_back(call(Subject::kGradNorm, Rejection::kNan, true, 0, "found NaN in grad norm"));
    calls.push_back(call(Subject::kGradNorm, Rejection::kInf, true, 0, "found Inf in grad norm"));
  }
  if (checks.large_grads)
    calls.push_back(call(Subject::kGradNorm, Rejection::kUnexpectedlyLarge, false, kLargeGradsFactor,
                         "found unexpected large grads"));
  return calls;
}

double relative_difference(double a, double b) {
  if (a == b || (std::isnan(a) && std::isnan(b))) return 0.0;
  if (std::isnan(a) || std::isnan(b) || std::isinf(a) || std::isinf(b)) return std::numeric_limits<double>::infinity();
  const double mean = (a + b) / 2;
  if (mean == 0) return std::numeric_limits<double>::infinity();  // a = -b != 0
  return std::fabs((a - b) / mean);
}

bool rejects(const ValidationCall& call, double value, double large_threshold) {
  switch (call.rejection) {
    case Rejection::kNan: return std::isnan(value);
    case Rejection::kInf: return std::isinf(value);
    case Rejection::kUnexpectedlyLarge: return std::isfinite(value) && std::fabs(value) >= large_threshold;
  }
  return false;
}

}  // namespace fp8tron::rerun
