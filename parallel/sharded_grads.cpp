#include "parallel/sharded_grads.h"

#include <algorithm>

#include "core/error.h"
#include "parallel/chained_all_reduce.h"
#include "parallel/unit_storage.h"

namespace fp8tron {

ShardedGrads::ShardedGrads(torch::Tensor shard, torch::Dtype dtype, std::shared_ptr<Communicator> group,
                           std::shared_ptr<Communicator> replicas)
    : shard_(std::move(shard)), dtype_(dtype), group_(std::move(group)), replicas_(std::move(replicas)) {
  FP8TRON_CHECK(shard_.dim() == 1 && shard_.is_contiguous() && shard_.scalar_type() == torch::kFloat32,
                "the gradient shard must be flat fp32");
  if (replicas_ && replicas_->size() == 1) replicas_.reset();
}

void ShardedGrads::add_unit(const std::vector<BufferParam>& params, bool kept) {
  torch::NoGradGuard no_grad;
  std::vector<BufferParam> sorted = params;
  std::sort(sorted.begin(), sorted.end(), [](const BufferParam& a, const BufferParam& b) { return a.offset < b.offset; });
  Unit u;
  u.kept = kept;
  int64_t numel = 0;
  for (const auto& p : sorted) {
    if (!u.pieces.empty() && u.pieces.back().offset + u.pieces.back().numel == p.offset) u.pieces.back().numel += p.numel;
    else u.pieces.push_back(Piece{p.offset, p.numel, numel});
    numel += p.numel;
  }
  u.buffer = torch::zeros({numel}, shard_.options().dtype(dtype_));
  u.bytes = numel * int64_t(u.buffer.element_size());
  int64_t at = 0;
  const size_t index = units_.size();
  for (const auto& p : sorted) {
    torch::Tensor t = p.tensor;
    t.mutable_grad() = u.buffer.narrow(0, at, p.numel).view(t.sizes());
    at += p.numel;
    unit_of_[t.unsafeGetTensorImpl()] = index;
    // Before autograd adds a gradient into the buffer (the unit's own pass has prepared it already,
    // unless the gradient comes from a later part: a deferred bias).
    if (t.requires_grad()) t.register_hook([this, index](const torch::Tensor&) { prepare(index); });
  }
  total_bytes_ += u.bytes;
  if (kept) {
    u.state = State::kAccumulating;  // for the whole run
    resident_bytes_ += u.bytes;
    peak_resident_bytes_ = std::max(peak_resident_bytes_, resident_bytes_);
  } else {
    empty_storage(u.buffer);
  }
  units_.push_back(std::move(u));
}

std::pair<int64_t, int64_t> ShardedGrads::own_part(const Piece& piece) const {
  const int64_t mine = int64_t(group_->rank()) * shard_.numel();
  const int64_t lo = std::clamp(mine, piece.offset, piece.offset + piece.numel);
  const int64_t hi = std::clamp(mine + shard_.numel(), piece.offset, piece.offset + piece.numel);
  return {lo, hi};
}

void ShardedGrads::allocate(Unit& u) {
  refill_storage(u.buffer, u.bytes);
  u.buffer.zero_();  // autograd and the wgrad GEMMs add into it
  u.state = State::kAccumulating;
  resident_bytes_ += u.bytes;
  peak_resident_bytes_ = std::max(peak_resident_bytes_, resident_bytes_);
}

void ShardedGrads::prepare(size_t index) {
  torch::NoGradGuard no_grad;
  Unit& u = units_[index];
  if (u.state == State::kAccumulating) return;  // this backward pass's (or a kept unit)
  if (u.state == State::kReducing) {
    // The previous micro-batch's reduction of it: finish it before the buffer is reused.
    reducing_.erase(std::find(reducing_.begin(), reducing_.end(), index));
    complete(u);
  }
  allocate(u);
}

void ShardedGrads::prepare_for(const torch::Tensor& param) {
  const auto it = unit_of_.find(param.unsafeGetTensorImpl());
  if (it != unit_of_.end()) prepare(it->second);
}

void ShardedGrads::reduce(size_t index) {
  torch::NoGradGuard no_grad;
  Unit& u = units_[index];
  if (u.kept || u.state != State::kAccumulating) return;
  launch(u);
  reducing_.push_back(index);
  while (reducing_.size() > kInFlight) {
    complete(units_[reducing_.front()]);
    reducing_.pop_front();
  }
}

// Each piece's sum lands on its owners: an uneven reduce-scatter per piece (rank-ordered sums on
// MPI, so one micro-batch gives the whole-buffer reduce-scatter's values bit for bit).
void ShardedGrads::launch(Unit& u) {
  int64_t own_numel = 0;
  for (const Piece& piece : u.pieces) {
    auto [lo, hi] = own_part(piece);
    own_numel += hi - lo;
  }
  u.received = torch::empty({own_numel}, u.buffer.options());
  int64_t at = 0;
  for (const Piece& piece : u.pieces) {
    auto [lo, hi] = own_part(piece);
    auto out = u.received.narrow(0, at, hi - lo);
    at += hi - lo;
    const auto in = u.buffer.narrow(0, piece.at, piece.numel);
    auto work = group_->reduce_scatter_v_async(out, in, shard_counts(piece.offset, piece.numel, shard_.numel(), group_->size()));
    if (replicas_ && out.numel() > 0) work = all_reduce_after(std::move(work), *group_, *replicas_, out);
    u.works.push_back(std::move(work));
  }
  u.state = State::kReducing;
}

void ShardedGrads::complete(Unit& u) {
  for (auto& work : u.works) group_->wait(*work);
  u.works.clear();
  const int64_t mine = int64_t(group_->rank()) * shard_.numel();
  int64_t at = 0;
  for (const Piece& piece : u.pieces) {
    auto [lo, hi] = own_part(piece);
    if (hi > lo) shard_.narrow(0, lo - mine, hi - lo).add_(u.received.narrow(0, at, hi - lo));
    at += hi - lo;
  }
  u.received = torch::Tensor();
  if (u.kept) {
    u.state = State::kAccumulating;
    return;
  }
  empty_storage(u.buffer);
  u.state = State::kEmpty;
  resident_bytes_ -= u.bytes;
}

void ShardedGrads::finish(const std::function<void()>& before_kept) {
  torch::NoGradGuard no_grad;
  for (size_t index : reducing_) complete(units_[index]);
  reducing_.clear();
  // Units whose gradients arrived outside autograd's accumulation hooks (or not at all) this step.
  for (auto& u : units_)
    if (!u.kept && u.state == State::kAccumulating) launch(u);
  for (auto& u : units_)
    if (!u.kept && u.state == State::kReducing) complete(u);
  if (before_kept) before_kept();
  for (auto& u : units_)
    if (u.kept) launch(u);
  for (auto& u : units_)
    if (u.kept) complete(u);
}

void ShardedGrads::zero() {
  torch::NoGradGuard no_grad;
  // Reductions of a step that never reached finish() (abandoned by the rerun machinery) land first:
  // every rank issued them, so every rank waits for them.
  for (size_t index : reducing_) complete(units_[index]);
  reducing_.clear();
  shard_.zero_();
  for (auto& u : units_) {
    if (u.kept) u.buffer.zero_();
    else if (u.state == State::kAccumulating) {  // a backward pass whose step never finished (a skipped rerun)
      empty_storage(u.buffer);
      u.state = State::kEmpty;
      resident_bytes_ -= u.bytes;
    }
  }
}

}  // namespace fp8tron
