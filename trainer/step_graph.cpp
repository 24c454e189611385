#include "trainer/step_graph.h"

#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include "core/error.h"
#include "fp8/gemm.h"
#include "fp8/grouped_gemm.h"

namespace fp8tron {
namespace {

// An empty tensor of `like`'s shape and type on the device, or undefined for an undefined one.
torch::Tensor static_like(const torch::Tensor& like, const torch::Device& device) {
  return like.defined() ? torch::empty(like.sizes(), like.options().device(device)) : torch::Tensor();
}

void copy_into(torch::Tensor& to, const torch::Tensor& from, const char* what) {
  if (to.defined() != from.defined() || (to.defined() && to.sizes() != from.sizes()))
    throw std::logic_error(std::string("--cuda-graph-impl full_iteration: the micro-batch's ") + what +
                           " changed shape after the graph's buffers were made");
  if (to.defined()) to.copy_(from, /*non_blocking=*/true);
}

}  // namespace

StepGraph::StepGraph(int64_t warmup_steps, torch::Device device, std::vector<fp8::GemmHandle*> gemm_handles)
    : warmup_steps_(warmup_steps), warmup_left_(warmup_steps), device_(device), gemm_handles_(std::move(gemm_handles)) {
  if (!device.is_cuda()) throw UserError("--cuda-graph-impl full_iteration needs a GPU (CUDA graphs); drop the flag on CPU");
}

StepGraph::~StepGraph() = default;

bool StepGraph::take_step(int64_t micro_batches) {
  if (replays(micro_batches)) return true;
  if (micro_batches != warming_for_) {
    if (warming_for_ >= 0) warmup_left_ = warmup_steps_;  // the first count's warm-up counts from the run's start
    warming_for_ = micro_batches;
  }
  if (warmup_left_ > 0) {
    --warmup_left_;
    return false;
  }
  return true;
}

bool StepGraph::replays(int64_t micro_batches) const { return graph_ && captured_micro_batches_ == micro_batches; }

void StepGraph::stage(const std::vector<Batch>& batches) {
  for (size_t m = staged_.size(); m < batches.size(); ++m) {
    const Batch& b = batches[m];
    staged_.push_back(Batch{static_like(b.tokens, device_), static_like(b.labels, device_),
                            static_like(b.loss_mask, device_), static_like(b.position_ids, device_),
                            static_like(b.segment_ids, device_)});
  }
  for (size_t m = 0; m < batches.size(); ++m) {
    Batch& to = staged_[m];
    const Batch& from = batches[m];
    copy_into(to.tokens, from.tokens, "tokens");
    copy_into(to.labels, from.labels, "labels");
    copy_into(to.loss_mask, from.loss_mask, "loss mask");
    copy_into(to.position_ids, from.position_ids, "position ids");
    copy_into(to.segment_ids, from.segment_ids, "document segments");
  }
}

const Batch& StepGraph::staged(int64_t m) const { return staged_.at(size_t(m)); }

std::vector<torch::Tensor> StepGraph::run(int64_t micro_batches, const Pass& pass) {
  if (!replays(micro_batches)) capture(micro_batches, pass);
  graph_->replay();
  ++replayed_;
  return outputs_;
}

void StepGraph::capture(int64_t micro_batches, const Pass& pass) {
  graph_.reset();
  outputs_.clear();
  const c10::DeviceIndex index = device_.index();
  // The warm-up steps' activations sit in the caching allocator as free blocks; the capture takes
  // its memory from a pool of its own, so those are given back first, or the step would hold both.
  c10::cuda::CUDACachingAllocator::emptyCache();
  auto graph = std::make_unique<at::cuda::CUDAGraph>();
  const c10::cuda::CUDAStream main = c10::cuda::getCurrentCUDAStream(index);
  // A capture cannot run on the default stream. The side stream starts after what the main stream
  // has queued (the staged batches, the zeroed gradients), and the replay runs on the main stream.
  if (!capture_stream_) capture_stream_ = c10::cuda::getStreamFromPool(/*isHighPriority=*/false, index);
  const c10::cuda::CUDAStream side = *capture_stream_;
  // Nor can it allocate with cudaMalloc: the cuBLASLt handles reserve their workspaces for that
  // stream first: the one a bf16 step uses (the bf16 linears' wgrad and the fused GeLU MLP's
  // GEMMs) and the FP8 engine's.
  fp8::grouped_gemm_resources().handle.reserve_workspace(side.stream());
  for (fp8::GemmHandle* handle : gemm_handles_) handle->reserve_workspace(side.stream());
  at::cuda::CUDAEvent queued;
  queued.record(main);
  queued.block(side);
  {
    c10::cuda::CUDAStreamGuard on_side(side);
    // Thread-local capture mode: the autograd engine's device thread launches the backward's
    // kernels onto the captured stream, and the data loader's thread pins host memory meanwhile.
    graph->capture_begin(/*pool=*/{0, 0}, cudaStreamCaptureModeThreadLocal);
    try {
      outputs_ = pass();
    } catch (const std::exception& e) {
      // End the capture so the stream and the allocator leave capture mode; its error (the
      // capture was invalidated) is secondary and not sticky: cleared, so that later CUDA calls
      // of this process do not report it. The graph and its private pool go with `graph`.
      try {
        graph->capture_end();
      } catch (const std::exception&) {
      }
      (void)cudaGetLastError();
      throw std::runtime_error(std::string("--cuda-graph-impl full_iteration: the step could not be captured as a "
                                           "CUDA graph (run without the flag): ") + e.what());
    }
    graph->capture_end();
  }
  at::cuda::CUDAEvent captured;
  captured.record(side);
  captured.block(main);
  graph_ = std::move(graph);
  captured_micro_batches_ = micro_batches;
}

}  // namespace fp8tron
