// Two pieces of work that take turns at the expert-parallel all-to-alls: the heart of Megatron's
// combined 1F1B schedule (--overlap-moe-expert-parallel-comm), where the forward pass of one
// micro-batch and the backward pass of another run interleaved, each all-to-all of one issued
// while the other computes.
//
// The two sides are ordinary code (a forward pass, an autograd backward pass) on two host
// threads, but only the side holding the turn runs. A side gives the turn away at each
// all-to-all of the expert-parallel group, right after issuing it and before waiting for it:
// TurnAtAllToAll is that group's wait observer. The other side then issues its own computation
// (on the GPU, onto the compute stream while the all-to-all runs on the group's communication
// stream) up to its own next all-to-all, and hands the turn back. So the sub-steps of the two
// micro-batches alternate exactly as Megatron's schedule plan orders them per layer:
//   backward: combine all-to-all | experts | dispatch all-to-all | router, attention, ...
//   forward:  attention, router  | dispatch all-to-all | experts | combine all-to-all
// The order in which work is issued depends only on the model and the micro-batch count, never
// on timing, so every rank issues its collectives in the same order and the arithmetic is the
// same as one micro-batch after the other (each parameter's gradient still sums the
// micro-batches in order: only one backward pass runs at a time).
#pragma once
#include <torch/torch.h>

#include <condition_variable>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>

#include "parallel/communicator.h"

namespace fp8tron {

// Thrown in one side of a pair at its hand-over when the other side ended on an exception.
class PartnerFailed : public std::runtime_error {
 public:
  PartnerFailed() : std::runtime_error("the other micro-batch of the combined 1F1B pair failed") {}
};

class AllToAllTurns {
 public:
  // Runs `first` (holding the turn at the start) on this thread and `second` on another, one at a
  // time, until both have ended; the second thread runs with this thread's autograd and
  // dispatcher state and, on `device` when it is a GPU, its current stream. When a side throws,
  // the other stops at its next hand-over (PartnerFailed), since going on alone it would issue
  // its all-to-alls out of the order the other ranks issue theirs; the side's own exception is
  // rethrown.
  void run_pair(const std::function<void()>& first, const std::function<void()>& second, torch::Device device);
  // Inside run_pair: the running side hands the turn to the other one (unless that one has ended)
  // and waits for it to come back; PartnerFailed when the other side has ended on an exception.
  // Outside run_pair: returns at once.
  void pass_turn();
  // Turns handed over since construction (a schedule test counts them).
  int64_t passes() const;

 private:
  void end_side(int side, bool failed);

  mutable std::mutex mutex_;
  std::condition_variable changed_;
  int holder_ = -1;  // the side running (0: first, 1: second); -1: no pair running
  bool ended_[2] = {false, false};
  bool failed_[2] = {false, false};  // ended on an exception
  int64_t passes_ = 0;
};

// The expert-parallel group's wait observer: the running side passes the turn after it issued an
// operation and before it waits for it; then `inner` (the exposed-time timer) or a plain wait.
// `before_turn` (--delay-wgrad-compute: the held weight-gradient GEMMs) runs first, after the
// issue: its work fills the time this side's own all-to-all is in flight (Megatron's
// `backward_dw` beside the backward dispatch). Only a backward pass holds such work, and it runs
// it before every hand-over, so the forward side always finds nothing to run.
class TurnAtAllToAll : public WaitObserver {
 public:
  TurnAtAllToAll(std::shared_ptr<AllToAllTurns> turns, std::shared_ptr<WaitObserver> inner,
                 std::function<void()> before_turn = {})
      : turns_(std::move(turns)), inner_(std::move(inner)), before_turn_(std::move(before_turn)) {}
  void wait(CommWork& work) override;

 private:
  std::shared_ptr<AllToAllTurns> turns_;
  std::shared_ptr<WaitObserver> inner_;
  std::function<void()> before_turn_;
};

}  // namespace fp8tron
