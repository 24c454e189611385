#include "rerun/error_injector.h"

#include <limits>

namespace fp8tron::rerun {
namespace {

constexpr double kMatch = 0.0;
constexpr double kMismatch = std::numeric_limits<double>::infinity();

}  // namespace

ErrorInjector::ErrorInjector(int64_t rate, InjectedError type, uint64_t seed) : rate_(rate), type_(type), stream_(seed) {}

int ErrorInjector::draw(int world_size) {
  if (rate_ <= 0 || pending_) return -1;
  const int64_t x = std::uniform_int_distribution<int64_t>(0, rate_ - 1)(stream_);
  // Megatron's rule (x + rank) % rate == 0 holds for exactly one rank below `rate`.
  const int64_t rank = (rate_ - x) % rate_;
  if (rank >= world_size) return -1;
  pending_ = type_;
  return int(rank);
}

double ErrorInjector::compare(double measured, bool in_place) {
  if (!pending_) return measured;
  const InjectedError injected = *pending_;
  if (in_place) {
    if (injected != InjectedError::kTransientError) return kMatch;  // decided by the re-run elsewhere
    pending_.reset();
    return kMismatch;
  }
  pending_.reset();
  // A transient error is diagnosed by the re-run in place and never reaches a checkpoint.
  return injected == InjectedError::kPersistentError ? kMismatch : kMatch;
}

void ErrorInjector::restore(int64_t rate, InjectedError type, std::optional<InjectedError> pending) {
  rate_ = rate;
  type_ = type;
  pending_ = pending;
}

}  // namespace fp8tron::rerun
