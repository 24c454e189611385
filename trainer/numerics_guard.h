// The two results the rerun engine validates each pass of an iteration (rerun/): the
// iteration's loss (averaged over micro-batches and data-parallel ranks) and the global gradient
// norm, which every rank holds alike. The loop never waits for the GPU before the optimizer step:
// values() and rejection() only queue work, so the step can be taken at once and skipped on the
// device when the host rule (rerun::rejects, evaluated here in double on the same bits) would
// reject; the loop then waits for the one small copy of the two values. The copy is queued
// (start_read) before the optimizer step and waited for (finish_read) after the step was queued:
// the host then resumes as soon as the values exist, and queues the next iteration while the GPU
// still runs the optimizer, instead of finding an empty queue.
#pragma once
#include <torch/torch.h>

#include <memory>
#include <utility>
#include <vector>

#include "rerun/rerun_state_machine.h"

namespace c10::cuda {
struct CUDAEvent;
}

namespace fp8tron {

class NumericsGuard {
 public:
  explicit NumericsGuard(torch::Device device);
  ~NumericsGuard();

  // [loss, grad norm] as fp64 on the device.
  torch::Tensor values(const torch::Tensor& loss, const torch::Tensor& grad_norm) const;
  // A 0-dim flag on the device, 1 when one of `calls` rejects `values` with the plan's thresholds,
  // or the plan injects a rejection.
  torch::Tensor rejection(const torch::Tensor& values, const std::vector<rerun::ValidationCall>& calls,
                          const rerun::PassPlan& plan) const;
  // The values on the host (loss, grad norm), in two halves: queue their copy to the host, then
  // (after queuing more work) wait for that copy only.
  void start_read(const torch::Tensor& values);
  std::pair<double, double> finish_read();

 private:
  torch::Device device_;
  torch::Tensor host_;  // [loss, grad norm], pinned for a GPU
  std::unique_ptr<c10::cuda::CUDAEvent> copied_;  // GPU: recorded after the copy start_read queued
  bool pending_ = false;
};

}  // namespace fp8tron
