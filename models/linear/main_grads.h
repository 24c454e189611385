// How a model's backward kernels treat the parameters' fp32 main gradients (the optimizer's flat
// buffer, which each parameter's `.grad` views). One object per model, made by whoever builds it
// (the trainer, from --no-gradient-accumulation-fusion) and handed to every module by the
// ModuleFactory; the autograd nodes that write gradients keep a reference to it. Two models with
// different settings can therefore live in one process.
//
// Gradient-accumulation fusion (Megatron's, on unless --no-gradient-accumulation-fusion): on a
// GPU, a linear whose weight gradient is an fp32 main gradient accumulates its wgrad GEMM straight
// into it, and autograd gets no weight gradient. Off: the GEMM writes dW in the weight's dtype and
// autograd adds it into the buffer (a separate read-add-write). A kernel choice: the math is the
// same up to the fp32 summation order.
//
// First writes: Megatron zeroes every main gradient before a step and every wgrad GEMM adds into
// it (beta = 1). For the bf16 linears whose weight and bias gradients only their own GEMMs write,
// the step's first GEMM can write them (beta = 0) and later micro-batches add: no zeroing pass over
// those 95% of the buffer, and no read of the zeros by the first GEMM. The result is the same bit
// for bit (0 + x = x). The trainer registers those parameters once (own; and takes them out of the
// optimizer's zeroing), starts each step with new_step(), and before the gradients are reduced
// zeroes any registered gradient the step did not write (zero_unwritten), so a weight that got no
// gradient still reads 0. The FP8 linears do the same through their engine (fp8/fp8_linear.h).
//
// Allocate-on-write (sharded gradients, parallel/sharded_grads.h): a main gradient may hold memory
// only while its unit's backward pass runs. A kernel that writes a gradient from outside that pass
// (a layer's output bias left to the next layer's norm, or to a pipeline stage's last add) calls
// allocate_before_write first; whoever shards the gradients sets what it does.
//
// Held weight gradients (--delay-wgrad-compute, Megatron's delay_wgrad_compute): with a queue set,
// the linears of the transformer layers register their weights (hold_wgrad_of) and their backward
// passes hand the weight-gradient GEMMs to the queue (fp8/held_wgrad.h) instead of running them;
// the schedule runs it (parallel/combined_schedule.h). The fused ops that compute a weight's
// gradient inside themselves (the norm + linear op, SwiGLU + linear, the GeLU MLP) step aside for
// such weights (delays_wgrad_of).
#pragma once
#include <torch/custom_class.h>
#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <mutex>
#include <unordered_map>
#include <memory>
#include <unordered_set>
#include <vector>

#include "core/deferred_work.h"

namespace fp8tron {

class MainGrads : public torch::CustomClassHolder {
 public:
  explicit MainGrads(bool gradient_accumulation_fusion = true) : fusion_(gradient_accumulation_fusion) {}

  bool fusion() const { return fusion_; }
  // Whether a kernel should put `param`'s gradient straight into its fp32 main gradient: fusion is
  // on and the parameter has one (models/linear/linear_grads.h's is_main_grad).
  bool fuses_into(const torch::Tensor& param) const;

  // The parameters whose main gradients the wgrad GEMMs write first; replaces any earlier set.
  void own(const std::vector<torch::Tensor>& params);
  // The gradients count as zeroed: each registered one's next GEMM writes.
  void new_step();
  // Whether `param` is registered and its main gradient not yet written since new_step(); marks it
  // written. The GEMM about to produce its gradient then writes instead of adding.
  bool take(const torch::Tensor& param);
  // Zeroes the registered main gradients that no GEMM wrote since new_step(). Called again without a
  // new_step() (a CUDA graph replaying the step whose first writes it captured: no host call marks
  // them), it zeroes again those it zeroed the first time, as the replayed step did not write them.
  void zero_unwritten();
  // How many first writes take() has granted (tests check the path runs).
  uint64_t granted() const;

  void set_allocate_on_write(std::function<void(const torch::Tensor& param)> allocate) { allocate_ = std::move(allocate); }
  void allocate_before_write(const torch::Tensor& param) const {
    if (allocate_) allocate_(param);
  }

  // --delay-wgrad-compute: the queue (set before the model is built; null: gradients at once).
  void set_wgrad_queue(std::shared_ptr<DeferredWork> queue) { wgrad_queue_ = std::move(queue); }
  const std::shared_ptr<DeferredWork>& wgrad_queue() const { return wgrad_queue_; }
  // A module's weight whose gradient the queue holds (no-op without a queue).
  void hold_wgrad_of(const torch::Tensor& param);
  bool delays_wgrad_of(const torch::Tensor& param) const;
  // The queue for `weight`'s gradient in a backward pass recorded now (grad mode on, the weight
  // requires a gradient), or null: computed at once.
  std::shared_ptr<DeferredWork> wgrad_queue_for(const torch::Tensor& weight) const;
  // The registered weights (the trainer tells the overlapped gradient reduction about them).
  std::vector<torch::Tensor> delayed_params() const;

 private:
  struct Entry {
    torch::Tensor param;
    const void* main_grad = nullptr;  // the `.grad` registered: a parameter given another gradient is not ours
    uint64_t written = 0;             // the step of its last write
    uint64_t zeroed = 0;              // the step in which zero_unwritten found it unwritten
  };
  const bool fusion_;
  mutable std::mutex mutex_;  // backward may run on autograd's device threads
  std::unordered_map<const c10::TensorImpl*, Entry> entries_;
  uint64_t step_ = 1;
  uint64_t granted_ = 0;
  std::shared_ptr<DeferredWork> wgrad_queue_;
  std::function<void(const torch::Tensor&)> allocate_;  // set_allocate_on_write
  std::vector<torch::Tensor> delayed_;
  std::unordered_set<const c10::TensorImpl*> delayed_keys_;
};

using MainGradsPtr = c10::intrusive_ptr<MainGrads>;

// A model's settings: fusion on (or off), no first writes registered.
inline MainGradsPtr make_main_grads(bool gradient_accumulation_fusion = true) {
  return c10::make_intrusive<MainGrads>(gradient_accumulation_fusion);
}

// The MainGrads an autograd node keeps, stored in and read back from its context.
inline c10::IValue main_grads_value(const MainGradsPtr& g) { return c10::IValue::make_capsule(g); }
inline MainGradsPtr main_grads_of(const c10::IValue& v) { return c10::static_intrusive_pointer_cast<MainGrads>(v.toCapsule()); }

}  // namespace fp8tron
