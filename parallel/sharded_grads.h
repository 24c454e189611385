// Megatron-FSDP's optim_grads and optim_grads_params (ZeRO-2 and ZeRO-3), the gradients' side: no
// rank holds the gradient of the whole model. Each unit of parallel/sharded_weights.h (a transformer layer, an embedding, the
// final norm, the output layer) accumulates its parameters' gradients in a flat buffer of its own,
// which holds memory only while its backward pass runs:
//  - the buffer is allocated and zeroed when the unit's backward pass starts (prepare: the same
//    moment the unit's weights are gathered again),
//  - once every one of its parameters has its gradient (reduce: the moment the weights are
//    released), each piece is reduce-scattered onto the ranks owning its elements (rank r owns
//    [r * shard_numel, (r + 1) * shard_numel) of the flat buffer, the distributed optimizer's
//    shards) and, once that is done, added into this rank's fp32 shard and the buffer emptied.
// As in Megatron-FSDP this happens in every backward pass, micro-batch by micro-batch: the shard
// sums the step's micro-batches (one micro-batch per step: the distributed optimizer's values bit for
// bit; several: the same sum in another order). At most kInFlight units wait for their reductions.
//
// A gradient can also arrive before its unit's backward pass starts: a layer's output bias left to
// the next layer's norm kernel (Megatron's bias-dropout-add fusion) gets its gradient in that next
// layer's backward pass, or at a pipeline stage's last add. Each parameter's gradient accumulator
// therefore prepares its unit first, and kernels that write a main gradient themselves call
// prepare_for (models/linear/main_grads.h's allocate-on-write).
//
// A unit marked `kept` keeps its buffer for the whole step and is reduced in finish(): gradients
// another group sums first (the tied embedding's copies on the first and last pipeline stages) or
// that held work completes after autograd has passed the weights (--delay-wgrad-compute).
#pragma once
#include <torch/torch.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <unordered_map>
#include <vector>

#include "parallel/communicator.h"
#include "parallel/grad_buckets.h"

namespace fp8tron {

class ShardedGrads {
 public:
  // `shard`: this rank's reduced gradients (fp32, shard_numel elements); `dtype`: the gradients'
  // dtype as autograd accumulates them (fp32, or the parameter dtype); `group`: the ranks the flat
  // buffer is sharded over; `replicas` (may be null): the ranks holding the same shard in the other
  // optimizer instances, over which each reduced piece is summed again.
  ShardedGrads(torch::Tensor shard, torch::Dtype dtype, std::shared_ptr<Communicator> group,
               std::shared_ptr<Communicator> replicas);
  ShardedGrads(const ShardedGrads&) = delete;
  ShardedGrads& operator=(const ShardedGrads&) = delete;

  // Adds a unit (the units of ShardedWeights, in the same order): `params`' gradients become views
  // into the unit's buffer.
  void add_unit(const std::vector<BufferParam>& params, bool kept);
  size_t num_units() const { return units_.size(); }

  void prepare(size_t unit);  // its backward pass starts: a zeroed buffer to accumulate into
  // prepare() for the unit holding `param`'s gradient, if any holds it.
  void prepare_for(const torch::Tensor& param);
  void reduce(size_t unit);   // its gradients of this backward pass are in
  // The step's backward passes are over: the units still holding gradients are reduced in unit
  // order (the same on every rank), `before_kept` runs, then the kept units are reduced; the shard
  // then holds the step's sums.
  void finish(const std::function<void()>& before_kept = {});
  void zero();  // a new step: the shard and the kept buffers zeroed

  torch::Tensor& shard() { return shard_; }
  // Gradient bytes held in units now / at most so far / all units at once (an unsharded buffer).
  int64_t resident_bytes() const { return resident_bytes_; }
  int64_t peak_resident_bytes() const { return peak_resident_bytes_; }
  int64_t total_bytes() const { return total_bytes_; }

  static constexpr size_t kInFlight = 1;

 private:
  struct Piece {
    int64_t offset, numel, at;  // flat-buffer range and its place in the unit's buffer
  };
  enum class State { kEmpty, kAccumulating, kReducing };
  struct Unit {
    std::vector<Piece> pieces;
    torch::Tensor buffer;    // flat; the parameters' gradients are views of it
    torch::Tensor received;  // this rank's parts of the pieces, while reducing
    std::vector<std::unique_ptr<CommWork>> works;
    int64_t bytes = 0;
    bool kept = false;
    State state = State::kEmpty;
  };
  void allocate(Unit& u);
  void launch(Unit& u);
  void complete(Unit& u);  // waits, adds into the shard, empties the buffer (kept: leaves it)
  // [lo, hi) of `piece` is this rank's (the elements its shard holds).
  std::pair<int64_t, int64_t> own_part(const Piece& piece) const;

  torch::Tensor shard_;
  torch::Dtype dtype_;
  std::shared_ptr<Communicator> group_, replicas_;
  std::vector<Unit> units_;
  std::unordered_map<const void*, size_t> unit_of_;  // parameter TensorImpl -> unit
  std::deque<size_t> reducing_;  // units whose reductions are in flight, oldest first
  int64_t resident_bytes_ = 0, peak_resident_bytes_ = 0, total_bytes_ = 0;
};

}  // namespace fp8tron
