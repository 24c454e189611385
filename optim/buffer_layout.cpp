#include "optim/buffer_layout.h"

#include <algorithm>
#include <numeric>
#include <optional>

#include "core/error.h"

namespace fp8tron {
namespace {

// Places the whole parameters `order` (most expensive first) into the free tails of `ranks`
// shards of `shard` elements each, after `front` elements laid out back to back from 0. Returns
// each one's shard, or nullopt when one does not fit.
std::optional<std::vector<int>> assign_shards(const std::vector<LayoutParam>& params, const std::vector<size_t>& order,
                                              int64_t front, int64_t shard, int ranks) {
  std::vector<int64_t> cursor(static_cast<size_t>(ranks));
  std::vector<double> load(size_t(ranks), 0.0);
  for (int r = 0; r < ranks; ++r) cursor[size_t(r)] = std::max(front, int64_t(r) * shard);
  std::vector<int> owner(params.size(), -1);
  for (size_t i : order) {
    int best = -1;
    for (int r = 0; r < ranks; ++r) {
      if (cursor[size_t(r)] + params[i].numel > int64_t(r + 1) * shard) continue;
      if (best < 0 || load[size_t(r)] < load[size_t(best)]) best = r;
    }
    if (best < 0) return std::nullopt;
    owner[i] = best;
    cursor[size_t(best)] += params[i].numel;
    load[size_t(best)] += params[i].cost;
  }
  return owner;
}

}  // namespace

double newton_schulz_cost(int64_t m, int64_t n) {
  const double big = double(std::max(m, n)), small = double(std::min(m, n));
  return big * small * small;
}

BufferLayout plan_buffer_layout(const std::vector<LayoutParam>& params, int ranks) {
  FP8TRON_CHECK(ranks >= 1, "a buffer needs at least one rank");
  BufferLayout layout;
  layout.offsets.assign(params.size(), 0);
  int64_t front = 0, whole_numel = 0;
  std::vector<size_t> whole;
  for (size_t i = 0; i < params.size(); ++i) {
    if (params[i].whole && ranks > 1) {
      whole.push_back(i);
      whole_numel += params[i].numel;
      continue;
    }
    layout.offsets[i] = front;
    front += params[i].numel;
  }
  if (whole.empty()) {
    layout.numel = front;
    layout.shard_numel = (front + ranks - 1) / ranks;
    return layout;
  }
  // Most expensive first; equal costs keep the given order (so the result is the same everywhere).
  std::stable_sort(whole.begin(), whole.end(), [&](size_t a, size_t b) { return params[a].cost > params[b].cost; });
  int64_t shard = std::max<int64_t>((front + whole_numel + ranks - 1) / ranks, 1);
  std::optional<std::vector<int>> owner;
  // Grows by an eighth until everything fits; a shard of front + whole_numel elements always does.
  while (!(owner = assign_shards(params, whole, front, shard, ranks))) shard += std::max<int64_t>(shard / 8, 1);
  // Within a shard the parameters keep the given order (the caller's grouping by optimizer
  // treatment), so runs of equally treated parameters stay contiguous.
  std::vector<int64_t> cursor(static_cast<size_t>(ranks));
  for (int r = 0; r < ranks; ++r) cursor[size_t(r)] = std::max(front, int64_t(r) * shard);
  std::vector<size_t> in_order = whole;
  std::sort(in_order.begin(), in_order.end());
  layout.numel = front;
  for (size_t i : in_order) {
    const int r = (*owner)[i];
    layout.offsets[i] = cursor[size_t(r)];
    cursor[size_t(r)] += params[i].numel;
    layout.numel = std::max(layout.numel, cursor[size_t(r)]);
  }
  layout.shard_numel = shard;
  return layout;
}

}  // namespace fp8tron
