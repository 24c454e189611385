#include "parallel/sharded_weights.h"

#include <torch/csrc/autograd/utils/lambda_post_hook.h>

#include <algorithm>

#include "core/error.h"
#include "parallel/unit_storage.h"

namespace fp8tron {

ShardedWeights::ShardedWeights(torch::Tensor shard, std::shared_ptr<Communicator> group, GatherPolicy policy,
                               int64_t byte_numel)
    : shard_(std::move(shard)), group_(std::move(group)), policy_(policy), byte_numel_(byte_numel) {
  FP8TRON_CHECK(shard_.dim() == 1 && shard_.is_contiguous(), "the weight shard must be flat");
}

void ShardedWeights::publish_bytes(torch::Tensor codes, Decode decode) {
  FP8TRON_CHECK(byte_numel_ > 0 && codes.numel() == shard_.numel() && codes.scalar_type() == torch::kUInt8,
                "the codes shard must match the weight shard");
  release_all();  // units gathered as values are gathered again, as codes
  codes_ = std::move(codes);
  decode_ = std::move(decode);
}

void ShardedWeights::add_unit(const std::vector<BufferParam>& params) {
  torch::NoGradGuard no_grad;
  if (params.empty()) return;
  std::vector<BufferParam> sorted = params;
  std::sort(sorted.begin(), sorted.end(), [](const BufferParam& a, const BufferParam& b) { return a.offset < b.offset; });
  Unit u;
  u.chunk = sorted.front().chunk;
  int64_t numel = 0;
  for (const auto& p : sorted) {
    const bool bytes = p.offset < byte_numel_;
    FP8TRON_CHECK(!bytes || p.offset + p.numel <= byte_numel_, "a weight across the byte-published boundary");
    Piece* last = u.pieces.empty() ? nullptr : &u.pieces.back();
    if (last && last->offset + last->numel == p.offset && (last->code_at >= 0) == bytes) {
      last->numel += p.numel;
    } else {
      u.pieces.push_back(Piece{p.offset, p.numel, numel, bytes ? u.code_numel : -1});
    }
    if (bytes) u.code_numel += p.numel;
    numel += p.numel;
  }
  u.buffer = torch::empty({numel}, shard_.options());
  u.bytes = numel * int64_t(u.buffer.element_size());
  const size_t index = units_.size();
  int64_t at = 0;
  for (const auto& p : sorted) {
    torch::Tensor t = p.tensor;
    FP8TRON_CHECK(!unit_of_.count(t.unsafeGetTensorImpl()), "a parameter in two sharded-weight units");
    auto view = u.buffer.narrow(0, at, p.numel);
    view.copy_(t.detach().reshape({-1}));  // every rank holds the same values now
    t.set_data(view.view(t.sizes()));
    unit_of_[t.unsafeGetTensorImpl()] = index;
    at += p.numel;
    if (!t.requires_grad()) continue;
    auto accumulator = torch::autograd::impl::grad_accumulator(t);
    FP8TRON_CHECK(accumulator != nullptr, "a parameter without a gradient accumulator");
    accumulator->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
        [this, index](const torch::autograd::variable_list& outputs, const torch::autograd::variable_list&) {
          grad_arrived(index);
          return outputs;
        }));
    accumulators_.push_back(std::move(accumulator));
    ++u.params;
  }
  total_bytes_ += u.bytes;
  resident_bytes_ += u.bytes;
  peak_resident_bytes_ = std::max(peak_resident_bytes_, resident_bytes_);
  u.resident = true;
  units_.push_back(std::move(u));
  release(index);
}

std::vector<size_t> ShardedWeights::units_of(const torch::nn::Module& module) const {
  std::vector<size_t> out;
  for (const auto& p : module.parameters()) {
    auto it = unit_of_.find(p.unsafeGetTensorImpl());
    if (it != unit_of_.end() && std::find(out.begin(), out.end(), it->second) == out.end()) out.push_back(it->second);
  }
  std::sort(out.begin(), out.end());
  return out;
}

void ShardedWeights::start(size_t index) {
  Unit& u = units_[index];
  if (u.resident) return;
  torch::NoGradGuard no_grad;
  refill_storage(u.buffer, u.bytes);
  u.resident = true;
  ++gathers_;
  resident_bytes_ += u.bytes;
  peak_resident_bytes_ = std::max(peak_resident_bytes_, resident_bytes_);
  const bool bytes = codes_.defined() && u.code_numel > 0;
  if (bytes) u.codes = torch::empty({u.code_numel}, codes_.options());
  u.decoded = !bytes;
  for (const Piece& piece : u.pieces) {
    if (bytes && piece.code_at >= 0) issue(u, piece, u.codes.narrow(0, piece.code_at, piece.numel), codes_);
    else issue(u, piece, u.buffer.narrow(0, piece.at, piece.numel), shard_);
  }
}

// The all-gather of `piece` into `whole` from the owners' parts of it in `shard` (values or codes).
void ShardedWeights::issue(Unit& u, const Piece& piece, torch::Tensor whole, const torch::Tensor& shard) {
  const int ranks = group_->size(), rank = group_->rank();
  const int64_t shard_numel = shard_.numel(), mine = int64_t(rank) * shard_numel;
  // This rank's part of the piece, from its shard.
  const int64_t lo = std::clamp(mine, piece.offset, piece.offset + piece.numel);
  const int64_t hi = std::clamp(mine + shard_numel, piece.offset, piece.offset + piece.numel);
  const auto own = hi > lo ? shard.narrow(0, lo - mine, hi - lo) : shard.narrow(0, 0, 0);
  if (ranks == 1) {
    whole.copy_(own);
    return;
  }
  u.works.push_back(group_->all_gather_v_async(whole, own, shard_counts(piece.offset, piece.numel, shard_numel, ranks)));
}

void ShardedWeights::finish(size_t index) {
  Unit& u = units_[index];
  for (auto& work : u.works) group_->wait(*work);
  u.works.clear();
  if (u.decoded) return;
  torch::NoGradGuard no_grad;
  for (const Piece& piece : u.pieces)
    if (piece.code_at >= 0) decode_(u.codes.narrow(0, piece.code_at, piece.numel), piece.offset, piece.numel);
  u.decoded = true;
}

void ShardedWeights::gather(size_t index, int direction) {
  start(index);
  finish(index);
  // The next unit of the pass: forward, one whose forward has not run yet (the tied word
  // embedding, gathered again for the output layer, must not pull in the position embedding);
  // backward, one whose backward is still due.
  const int64_t next = int64_t(index) + direction;
  if (!policy_.prefetch || direction == 0 || next < 0 || next >= int64_t(units_.size()) || units_[size_t(next)].chunk != units_[index].chunk) return;
  if (units_[size_t(next)].awaiting_backward == (direction < 0)) start(size_t(next));
}

void ShardedWeights::release(size_t index) {
  Unit& u = units_[index];
  if (!u.resident) return;
  for (auto& work : u.works) group_->wait(*work);  // a prefetch still writing into the buffer
  u.works.clear();
  empty_storage(u.buffer);
  u.codes = torch::Tensor();  // the FP8 weights decoded from them keep them while in use
  u.decoded = true;
  u.resident = false;
  resident_bytes_ -= u.bytes;
}

bool ShardedWeights::replaying() const { return policy_.replaying && policy_.replaying(); }

void ShardedWeights::gather_for(const torch::nn::Module& module) {
  const int direction = replaying() ? 0 : +1;
  for (size_t unit : units_of(module)) gather(unit, direction);
}

void ShardedWeights::release_for(const torch::nn::Module& module, const std::vector<torch::Tensor>& outputs) {
  release_deferred();  // the module that read them has run its forward pass
  const std::vector<size_t> units = units_of(module);
  if (units.empty()) return;
  bool backward = false;
  for (const auto& out : outputs) backward = backward || (out.defined() && out.requires_grad());
  const std::vector<size_t> read_next = units_among(outputs);
  const bool keep = policy_.keep_gathered || (backward && (policy_.keep_after_forward || replaying()));
  for (size_t unit : units) {
    if (keep) {
      // kept until its backward pass has its gradients (keep_gathered: until the shard changes)
    } else if (std::find(read_next.begin(), read_next.end(), unit) != read_next.end()) {
      deferred_.push_back(unit);
    } else {
      release(unit);
    }
    units_[unit].pending = units_[unit].params;  // the coming backward pass releases it again
    units_[unit].awaiting_backward = backward;
  }
  for (const auto& out : outputs) {
    if (!out.defined() || !out.requires_grad()) continue;
    // The first gradient reaching the module's outputs: its backward pass is about to start.
    out.register_hook([this, units](const torch::Tensor&) {
      // With a pipeline several micro-batches' forwards run before their backwards: a unit whose
      // gradients have all arrived (released by the previous backward) is armed again, so each
      // backward releases it once its gradients are in. (A unit armed already, by its forward or
      // by another of its parts' outputs in this backward, keeps counting.)
      for (size_t unit : units) {
        units_[unit].awaiting_backward = false;
        if (units_[unit].pending <= 0) units_[unit].pending = units_[unit].params;
        if (backward_starts_) backward_starts_(unit);
      }
      for (auto it = units.rbegin(); it != units.rend(); ++it) gather(*it, -1);
    });
  }
}

std::vector<size_t> ShardedWeights::units_among(const std::vector<torch::Tensor>& tensors) const {
  std::vector<size_t> out;
  for (const auto& t : tensors) {
    if (!t.defined()) continue;
    auto it = unit_of_.find(t.unsafeGetTensorImpl());
    if (it != unit_of_.end()) out.push_back(it->second);
  }
  return out;
}

void ShardedWeights::release_deferred() {
  for (size_t unit : deferred_) release(unit);
  deferred_.clear();
}

void ShardedWeights::grad_arrived(size_t index) {
  Unit& u = units_[index];
  if (u.pending <= 0) return;  // not armed by a forward pass (or already released)
  if (--u.pending > 0) return;
  if (!policy_.keep_gathered) release(index);
  if (grads_done_) grads_done_(index);
}

void ShardedWeights::follow_backward(std::function<void(size_t)> starts, std::function<void(size_t)> done) {
  backward_starts_ = std::move(starts);
  grads_done_ = std::move(done);
}

void ShardedWeights::gather_all() {
  const int64_t peak = peak_resident_bytes_;  // the passes' peak: this is for readers of the whole model
  for (size_t i = 0; i < units_.size(); ++i) start(i);
  peak_resident_bytes_ = peak;
  for (size_t i = 0; i < units_.size(); ++i) finish(i);
}

void ShardedWeights::release_all() {
  deferred_.clear();
  for (size_t i = 0; i < units_.size(); ++i) {
    release(i);
    units_[i].pending = 0;
    units_[i].awaiting_backward = false;
  }
}

}  // namespace fp8tron
