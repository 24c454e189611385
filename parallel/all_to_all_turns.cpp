#include "parallel/all_to_all_turns.h"

#include <ATen/ThreadLocalState.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <optional>
#include <thread>

#include "core/error.h"

namespace fp8tron {

void AllToAllTurns::run_pair(const std::function<void()>& first, const std::function<void()>& second,
                             torch::Device device) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    FP8TRON_CHECK(holder_ == -1, "AllToAllTurns::run_pair inside a running pair");
    holder_ = 0;
    ended_[0] = ended_[1] = failed_[0] = failed_[1] = false;
  }
  std::exception_ptr errors[2];
  const at::ThreadLocalState state;  // grad mode and dispatcher state carry over to the second side
  std::optional<c10::cuda::CUDAStream> stream;
  if (device.is_cuda()) stream = c10::cuda::getCurrentCUDAStream(device.index());
  std::thread other([&] {
    try {
      at::ThreadLocalStateGuard same_state(state);
      std::optional<c10::cuda::CUDAStreamGuard> same_stream;
      if (stream) same_stream.emplace(*stream);
      bool first_failed = false;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        changed_.wait(lock, [&] { return holder_ == 1; });
        first_failed = failed_[0];
      }
      if (first_failed) throw PartnerFailed();
      second();
    } catch (...) {
      errors[1] = std::current_exception();
    }
    end_side(1, errors[1] != nullptr);
  });
  try {
    first();
  } catch (...) {
    errors[0] = std::current_exception();
  }
  end_side(0, errors[0] != nullptr);
  other.join();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    holder_ = -1;
  }
  // The error that ended the pair first, not the other side's PartnerFailed.
  auto is_partner = [](const std::exception_ptr& e) {
    try {
      std::rethrow_exception(e);
    } catch (const PartnerFailed&) {
      return true;
    } catch (...) {
      return false;
    }
  };
  for (const auto& e : errors)
    if (e && !is_partner(e)) std::rethrow_exception(e);
  for (const auto& e : errors)
    if (e) std::rethrow_exception(e);
}

void AllToAllTurns::end_side(int side, bool failed) {
  std::lock_guard<std::mutex> lock(mutex_);
  ended_[side] = true;
  failed_[side] = failed;
  holder_ = 1 - side;  // the other side runs to its end (or has ended already)
  changed_.notify_all();
}

void AllToAllTurns::pass_turn() {
  std::unique_lock<std::mutex> lock(mutex_);
  const int me = holder_;  // only the holder runs, whichever thread executes its code
  if (me < 0) return;
  if (failed_[1 - me]) throw PartnerFailed();
  if (ended_[1 - me]) return;
  holder_ = 1 - me;
  ++passes_;
  changed_.notify_all();
  changed_.wait(lock, [&] { return holder_ == me; });
  if (failed_[1 - me]) throw PartnerFailed();
}

int64_t AllToAllTurns::passes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return passes_;
}

void TurnAtAllToAll::wait(CommWork& work) {
  if (before_turn_) before_turn_();
  turns_->pass_turn();
  if (inner_) inner_->wait(work);
  else work.wait();
}

}  // namespace fp8tron
