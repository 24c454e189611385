// --cuda-graph-impl full_iteration (Megatron's full-iteration CUDA graph): the forward and backward
// passes over every micro-batch of a step, captured once as one CUDA graph after
// --cuda-graph-warmup-steps eager steps, and replayed by every later step. Thousands of kernel
// launches become one, and the GPU no longer idles while the host issues small kernels.
//
// A replay runs the captured kernels on the captured addresses, so:
// - the step's micro-batches are copied into static device buffers before each replay (stage());
// - the pass's outputs (the loss sums) are the capture's tensors, overwritten by each replay;
// - every host decision taken while the pass was captured is replayed as taken: the backward scale,
//   which main gradients a GEMM writes first (models/linear/main_grads.h). The trainer graphs
//   only runs where those are the same every step (the refusals are in trainer/cli/cuda_graph_args.cpp).
// The optimizer step, the gradient norm and the numerics checks stay outside the graph and run
// eagerly after each replay, as in Megatron, where the graph wraps forward_backward_func only.
// FP8 steps replay too: the delayed-scaling scales and amax histories live on the device at fixed
// addresses and end_step() updates them in place after the replay; the weights' FP8 casts, cached
// for the step, are the capture's buffers, written again by each replay's first micro-batch.
#pragma once
#include <torch/torch.h>

#include <c10/cuda/CUDAStream.h>

#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "data/loader/batch_loader.h"

namespace at::cuda {
struct CUDAGraph;
}
namespace fp8tron::fp8 {
class GemmHandle;
}

namespace fp8tron {

class StepGraph {
 public:
  // `gemm_handles`: the cuBLASLt handles the step uses besides the grouped GEMMs' (an FP8
  // engine's), whose workspaces are reserved for the capture stream before each capture.
  StepGraph(int64_t warmup_steps, torch::Device device, std::vector<fp8::GemmHandle*> gemm_handles = {});
  ~StepGraph();
  StepGraph(const StepGraph&) = delete;
  StepGraph& operator=(const StepGraph&) = delete;

  // Whether a step of `micro_batches` goes through the graph: after the warm-up steps, which this
  // counts (each call during the warm-up is one eager step). A new micro-batch count (a batch-size
  // rampup) warms up anew before its capture: its first steps create the GEMM plans and
  // workspaces of accumulating micro-batches eagerly, as the capture may not.
  bool take_step(int64_t micro_batches);
  // Whether the graph holds a capture for `micro_batches` (a step replays it; else run() captures).
  bool replays(int64_t micro_batches) const;
  // Copies the step's micro-batches into the static buffers the graph reads (allocated at the
  // first call; the shapes are the run's).
  void stage(const std::vector<Batch>& batches);
  // The static buffers of micro-batch `m`, for the pass to read while it is captured.
  const Batch& staged(int64_t m) const;
  // Runs the step's pass: captures `pass` first when the graph holds none for this micro-batch
  // count, then replays. Returns the pass's outputs: the capture's tensors, valid until the next
  // replay.
  using Pass = std::function<std::vector<torch::Tensor>()>;
  std::vector<torch::Tensor> run(int64_t micro_batches, const Pass& pass);
  int64_t replayed() const { return replayed_; }

 private:
  void capture(int64_t micro_batches, const Pass& pass);

  int64_t warmup_steps_, warmup_left_;
  int64_t warming_for_ = -1;  // the micro-batch count the warm-up steps ran for
  torch::Device device_;
  std::vector<fp8::GemmHandle*> gemm_handles_;
  std::unique_ptr<at::cuda::CUDAGraph> graph_;
  std::optional<c10::cuda::CUDAStream> capture_stream_;  // the same for every capture
  int64_t captured_micro_batches_ = 0;
  std::vector<Batch> staged_;
  std::vector<torch::Tensor> outputs_;
  int64_t replayed_ = 0;
};

}  // namespace fp8tron
