// Fine-grained activation offloading (Megatron's --fine-grained-activation-offloading): the tensors
// a module keeps for its backward pass are copied to host memory once the forward pass no longer
// needs them, their device memory is released, and they are copied back just before the backward
// pass reaches the module.
//
// How, without saved-tensor hooks: every node that saved such a tensor holds it through the same
// storage. The offloader copies the storage's bytes out and releases its memory (the storage keeps
// its identity, as output-discarding recomputation does); a hook on the gradient node of the
// module's output gives the storage memory again and copies the bytes back before that node (and
// so any node of the module) runs backward. Every saved alias then reads the original values.
//
// Order of events on CUDA: the device-to-host copy runs on a side stream after the module's
// forward kernels (an event), and the released block is not reused before it finished (the
// allocator is told the side stream used it). The host-to-device copy runs on another side stream;
// the backward waits for it (an event) before the module's gradient node runs, and each reload
// starts the copy of the group offloaded before it in the same forward pass (the next one the
// backward needs), so that copy overlaps this module's backward. On CPU the copies are plain
// copies into (and out of) a host buffer, with the same release and refill, so the bookkeeping is
// the same.
//
// Use: group = begin(module, tensors, keep); run the module; after() attaches the reload to the
// module's output; offload(group) once no forward consumer of the tensors remains (later for a
// norm's input, which a residual add still reads). Nothing happens without grad mode, in the first
// pass of a recomputed function (its graph is dropped) or in a recomputation's replay.
#pragma once
#include <torch/torch.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace fp8tron {

struct OffloadGroup;

class ActivationOffloader {
 public:
  // Tensors of fewer than `min_tensor_size` elements stay on the device (--min-offloaded-tensor-size).
  explicit ActivationOffloader(int64_t min_tensor_size);
  ~ActivationOffloader();

  // Starts a forward pass of the model chunk: groups chain to the earlier ones of the same pass
  // (the prefetch order); deferred groups of an earlier pass are dropped, never offloaded.
  void begin_forward();

  // The group of `module`'s saved `tensors`: their storages, each once, except storages shared
  // with `keep` (tensors the forward pass reads later), leaves (parameters, a stage's received
  // input), memory the storage cannot allocate again, and storages another group holds. Null when
  // nothing is to be offloaded (see above).
  std::shared_ptr<OffloadGroup> begin(const std::string& module, const std::vector<torch::Tensor>& tensors,
                                      const std::vector<torch::Tensor>& keep = {});
  // Reload before `module_output`'s gradient node runs (and any node before it in backward).
  void after(const std::shared_ptr<OffloadGroup>& group, const torch::Tensor& module_output);
  // Copies the group's storages to host memory and releases their device memory (only after
  // after() attached the reload: a group nothing would bring back stays on the device).
  void offload(const std::shared_ptr<OffloadGroup>& group);
  // offload() once the caller's last forward consumer has run (offload_deferred()).
  void defer(const std::shared_ptr<OffloadGroup>& group);
  void offload_deferred();

  // Bytes offloaded since the last call (the step's counter).
  int64_t take_offloaded_bytes();
  // Bytes offloaded per module name since construction.
  std::map<std::string, int64_t> bytes_by_module() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// module() with `tensors` (read by it, kept for its backward, read by nothing after it in the
// forward pass except `keep`) offloaded as `name`'s group as soon as it returned. Null offloader:
// module() alone.
torch::Tensor offloaded_call(ActivationOffloader* offloader, const std::string& name, const std::vector<torch::Tensor>& tensors,
                             const std::function<torch::Tensor()>& module, const std::vector<torch::Tensor>& keep = {});

}  // namespace fp8tron
