// Megatron-FSDP's optim_grads_params strategy (ZeRO-3), the weights' side: between uses each
// data-parallel rank keeps only its shard of the model weights, the same contiguous shard of the
// flat buffer the distributed optimizer updates (rank r owns [r * shard_numel, (r + 1) * shard_numel)).
//
// The weights are grouped into units (a transformer layer, the embedding, the final norm, the
// output layer). A unit's parameters are views into one flat buffer of its own; while the unit is
// released that buffer's storage holds no memory at all (its StorageImpl is emptied in place, so
// every view, and every copy autograd saved of a parameter, stays valid and sees the bytes again
// once they are gathered). A unit is
//  - gathered (an uneven all-gather of its pieces from their owners) just before a module that
//    uses it runs forward (gather_for, the model's params-ready hook),
//  - released right after that module's forward pass (release_for, the params-used hook), which
//    also hooks the module's outputs so that the first gradient reaching them gathers the unit again
//    for the backward pass; a unit one of whose parameters is itself among the outputs (an output
//    projection's bias left to the next layer's norm kernel, ResidualStream::branch_bias) is
//    released after the next module's forward pass instead, as that module reads it; a module
//    replayed by activation recomputation inside the backward pass keeps its units for the
//    backward pass that follows (GatherPolicy::replaying),
//  - released again once every one of its parameters has received its gradient.
// With prefetching (--overlap-param-gather) gathering unit i also issues, without waiting, the
// all-gather of the unit the pass needs next (i + 1 forward, i - 1 backward) within the same model
// chunk: an interleaved pipeline runs another chunk next only after other work, often much later.
// A released weight has no data at all: reading it is a bug that faults on the null address.
// Under optim_grads (GatherPolicy::keep_gathered) the same units are gathered once per step and
// never released in the passes: they follow the backward passes only so that the gradients are
// sharded (parallel/sharded_grads.h).
//
// Weights published as bytes (--fp8-param-gather: the flat buffer's first `byte_numel` elements,
// whole FP8 weights) are gathered as their one-byte codes, from the optimizer's codes shard, once
// publish_bytes() has been called (after the optimizer's first cast; until then they are gathered
// as values like the rest): each gathered unit hands its codes to `decode`, which writes the
// weights' values and keeps the codes for the FP8 GEMMs. A unit's codes are a fresh tensor per
// gather, which the FP8 weights go on referencing after the unit's release.
#pragma once
#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <unordered_map>
#include <vector>

#include "parallel/communicator.h"
#include "parallel/grad_buckets.h"

namespace fp8tron {

// When units are gathered and released beyond the minimum (gathered just before use, released
// right after it).
struct GatherPolicy {
  bool prefetch = false;  // --overlap-param-gather: gathering a unit issues the next one's gather
  // --torch-fsdp2-no-reshard-after-forward: a unit whose forward pass will have a backward pass stays
  // gathered until that backward pass has its gradients (no second gather).
  bool keep_after_forward = false;
  // Megatron-FSDP's optim_grads: the weights are not sharded between uses. A unit gathered at its
  // first use after the shard changed (the step's new weights: the distributed optimizer's
  // all-gather, unit by unit) stays gathered until the shard changes again (release_all); the
  // units still follow each backward pass, so their gradients are sharded as under ZeRO-3.
  bool keep_gathered = false;
  // Whether the forward pass running now replays a recomputed part inside the backward pass
  // (activation recomputation; null: never). Its units stay gathered for the backward pass that
  // follows at once, as Megatron-FSDP keeps them (two gathers per step, not three), and it
  // prefetches nothing: the unit after it in forward order has had its backward pass already.
  std::function<bool()> replaying;
};

class ShardedWeights {
 public:
  // `shard`: this rank's shard_numel elements of the flat weight buffer (parameter dtype), which
  // the optimizer writes after each step; `group`: the ranks the buffer is sharded over.
  // `byte_numel`: the leading elements of the flat buffer that may be published as bytes.
  ShardedWeights(torch::Tensor shard, std::shared_ptr<Communicator> group, GatherPolicy policy, int64_t byte_numel = 0);
  ShardedWeights(const ShardedWeights&) = delete;
  ShardedWeights& operator=(const ShardedWeights&) = delete;

  // Adds a unit (units come in forward order): `params` (their offsets in the flat buffer) become
  // views into the unit's own buffer, which is released at once.
  void add_unit(const std::vector<BufferParam>& params);
  size_t num_units() const { return units_.size(); }

  // Gathers the units holding any of `module`'s parameters (other buffers' are skipped).
  void gather_for(const torch::nn::Module& module);
  // Releases them, and arms their gather for the backward pass on `outputs` (those requiring grad).
  // A unit with a parameter among `outputs` stays gathered until the next release_for call.
  void release_for(const torch::nn::Module& module, const std::vector<torch::Tensor>& outputs);
  void gather_all();
  // From now on the byte-published weights are gathered as codes: `codes` is this rank's shard of
  // them (uint8, the same elements as shard()), `decode(codes, offset, numel)` takes the codes of
  // the whole weights in the flat-buffer range [offset, offset + numel).
  using Decode = std::function<void(const torch::Tensor& codes, int64_t offset, int64_t numel)>;
  void publish_bytes(torch::Tensor codes, Decode decode);
  // Every unit released (the shard changed, or a step's backward is over).
  void release_all();
  // Sharded gradients (parallel/sharded_grads.h) follow the units through each backward pass:
  // `starts(unit)` as the unit's backward pass starts (before its weights are gathered for it),
  // `done(unit)` once every one of its parameters has received its gradient (as it is released).
  void follow_backward(std::function<void(size_t)> starts, std::function<void(size_t)> done);

  torch::Tensor& shard() { return shard_; }
  bool resident(size_t unit) const { return units_[unit].resident; }
  // Bytes of weights this rank holds gathered now / at most so far in forward and backward passes
  // (gather_all not counted) / all units gathered at once.
  int64_t resident_bytes() const { return resident_bytes_; }
  int64_t peak_resident_bytes() const { return peak_resident_bytes_; }
  int64_t total_bytes() const { return total_bytes_; }
  // Units gathered so far (each all-gather of a unit counted once; gather_all not counted).
  int64_t gathers() const { return gathers_; }

 private:
  struct Piece {
    int64_t offset, numel, at;  // flat-buffer range and its place in the unit's buffer
    int64_t code_at = -1;       // a byte-published piece: its place in the unit's codes
  };
  struct Unit {
    std::vector<Piece> pieces;  // merged (not across the byte boundary), in offset order
    torch::Tensor buffer;       // flat; the parameters are views of it
    int64_t code_numel = 0;     // elements of its byte-published pieces
    torch::Tensor codes;        // uint8, while gathered as bytes
    bool decoded = true;        // the gathered codes written into the weights
    int64_t bytes = 0;
    int params = 0, pending = 0;  // parameters, and those still waiting for their gradient
    int chunk = 0;                // the model chunk (virtual pipeline stage) it belongs to
    bool resident = false;
    bool awaiting_backward = false;  // released after a forward pass whose backward has not reached it
    std::vector<std::unique_ptr<CommWork>> works;  // an all-gather in flight
  };
  std::vector<size_t> units_of(const torch::nn::Module& module) const;
  void start(size_t unit);  // allocates and issues the all-gather
  void gather(size_t unit, int direction);  // waits; then prefetches unit + direction (0: none)
  void finish(size_t unit);                 // waits for its all-gathers and decodes its codes
  void issue(Unit& u, const Piece& piece, torch::Tensor whole, const torch::Tensor& shard);
  void release(size_t unit);
  std::vector<size_t> units_among(const std::vector<torch::Tensor>& tensors) const;  // parameters' units
  void release_deferred();
  void grad_arrived(size_t unit);
  bool replaying() const;

  torch::Tensor shard_;
  std::shared_ptr<Communicator> group_;
  GatherPolicy policy_;
  int64_t byte_numel_;
  torch::Tensor codes_;  // publish_bytes()
  Decode decode_;
  std::vector<Unit> units_;
  std::vector<size_t> deferred_;  // released at the next release_for call
  std::unordered_map<const void*, size_t> unit_of_;  // parameter (TensorImpl) -> unit
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;  // keeps the hooked nodes alive
  std::function<void(size_t)> backward_starts_, grads_done_;  // follow_backward()
  int64_t resident_bytes_ = 0, peak_resident_bytes_ = 0, total_bytes_ = 0, gathers_ = 0;
};

}  // namespace fp8tron
