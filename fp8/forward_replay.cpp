#include "fp8/forward_replay.h"

namespace fp8tron::fp8 {
namespace {
thread_local bool replaying = false;
}

ForwardReplayGuard::ForwardReplayGuard() : previous_(replaying) { replaying = true; }
ForwardReplayGuard::~ForwardReplayGuard() { replaying = previous_; }
bool forward_replay_active() { return replaying; }

}  // namespace fp8tron::fp8
