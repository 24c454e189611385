// Exposed communication time: how long the compute side stalls waiting for a group's operations
// (the part of the communication that no computation hides). Attached to a group as its wait
// observer (Communicator::set_wait_observer), so the plain tensor-parallel mappings and the
// overlapped linears are measured the same way, at every wait.
//   GPU: an event is recorded on the compute stream just before and just after the wait (which
//        makes the stream wait for the communication's event): the time between the two is the
//        stall. Read once per step after the step's own synchronization; no extra syncs.
//   CPU: the host time spent inside the wait (MPI progresses only then, so this is the whole
//        transfer that the host did not overlap).
#pragma once
#include <memory>

#include "parallel/communicator.h"

namespace fp8tron::overlap {

class CommTimer : public WaitObserver {
 public:
  explicit CommTimer(bool cuda);
  ~CommTimer() override;
  void wait(CommWork& work) override;
  // Milliseconds of stall since the previous call. On the GPU the device must have finished the
  // measured work (the caller synchronized).
  double take_ms();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace fp8tron::overlap
