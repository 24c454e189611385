// Work that a backward pass holds to run later: the weight-gradient GEMMs of
// --delay-wgrad-compute (Megatron's delayed wgrad, TE's wgrad store and `backward_dw`). An autograd
// node computes its input's gradient at once and, instead of its weights' gradients, hands over a
// closure that computes them; whoever owns the queue runs the closures, in the order they were
// held, where the schedule wants them (for the combined 1F1B schedule: while an all-to-all of the
// same backward pass is in flight, parallel/all_to_all_turns.h, and at the end of the pass).
//
// Each closure names the parameters whose gradients it completes (opaque keys: their tensors'
// implementations); after it ran, the queue reports each of them to the `on_done` callback, so
// an overlapped data-parallel reduction can start a bucket once its deferred gradients exist.
// Torch-free: fp8/ and models/ fill it, parallel/ and the trainer run it.
#pragma once
#include <cstdint>
#include <functional>
#include <mutex>
#include <utility>
#include <vector>

namespace fp8tron {

class DeferredWork {
 public:
  using Key = const void*;
  // Holds `work`, which completes the gradients of `params`.
  void hold(std::function<void()> work, std::vector<Key> params);
  // Runs the held work in the order it was held (work held meanwhile runs too), reporting each
  // closure's parameters to on_done; returns how many closures ran.
  int64_t run();
  bool empty() const;
  // Called with each parameter whose gradient a closure completed (set before the first run).
  void set_on_done(std::function<void(Key)> on_done) { on_done_ = std::move(on_done); }
  // Closures held and run since construction (tests and the log).
  int64_t held() const;
  int64_t ran() const;

 private:
  struct Item {
    std::function<void()> work;
    std::vector<Key> params;
  };
  mutable std::mutex mutex_;  // held from autograd's device threads, run from the schedule's
  std::vector<Item> items_;
  std::function<void(Key)> on_done_;
  int64_t held_ = 0, ran_ = 0;
};

}  // namespace fp8tron
