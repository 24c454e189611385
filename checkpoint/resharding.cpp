#include "checkpoint/resharding.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "core/text.h"

namespace fp8tron::checkpoint {

namespace {

std::string dims_string(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

bool contains(const Box& outer, const Box& inner) {
  for (size_t d = 0; d < outer.shape.size(); ++d)
    if (inner.offset[d] < outer.offset[d] ||
        inner.offset[d] + inner.shape[d] > outer.offset[d] + outer.shape[d])
      return false;
  return true;
}

void check_box(const std::string& tensor, const std::vector<int64_t>& global_shape, const Box& box,
               const char* what) {
  if (box.offset.size() != global_shape.size() || box.shape.size() != global_shape.size())
    throw UserError(strprintf("tensor '%s': %s has offset %s and shape %s, which do not both have "
                              "the tensor's %zu dims (shape %s)",
                              tensor.c_str(), what, dims_string(box.offset).c_str(),
                              dims_string(box.shape).c_str(), global_shape.size(),
                              dims_string(global_shape).c_str()));
  for (size_t d = 0; d < global_shape.size(); ++d)
    if (box.offset[d] < 0 || box.shape[d] < 0 || box.offset[d] + box.shape[d] > global_shape[d])
      throw UserError(strprintf("tensor '%s': %s %s lies outside the tensor's shape %s",
                                tensor.c_str(), what, box_string(box).c_str(),
                                dims_string(global_shape).c_str()));
}

// Some cell of `target` that no source covers (sources are disjoint and clipped to target).
Box find_uncovered(const Box& target, const std::vector<Box>& covered) {
  const size_t n = target.shape.size();
  std::vector<std::vector<int64_t>> cuts(n);
  for (size_t d = 0; d < n; ++d) {
    cuts[d] = {target.offset[d], target.offset[d] + target.shape[d]};
    for (const auto& b : covered) {
      cuts[d].push_back(b.offset[d]);
      cuts[d].push_back(b.offset[d] + b.shape[d]);
    }
    std::sort(cuts[d].begin(), cuts[d].end());
    cuts[d].erase(std::unique(cuts[d].begin(), cuts[d].end()), cuts[d].end());
  }
  std::vector<size_t> idx(n, 0);
  for (;;) {
    Box cell{std::vector<int64_t>(n), std::vector<int64_t>(n)};
    for (size_t d = 0; d < n; ++d) {
      cell.offset[d] = cuts[d][idx[d]];
      cell.shape[d] = cuts[d][idx[d] + 1] - cuts[d][idx[d]];
    }
    bool hit = std::any_of(covered.begin(), covered.end(), [&](const Box& b) { return contains(b, cell); });
    if (!hit) return cell;
    size_t d = n;
    while (d > 0) {
      --d;
      if (++idx[d] + 1 < cuts[d].size()) break;
      idx[d] = 0;
      if (d == 0) return target;  // unreachable when volumes disagree
    }
    if (n == 0) return target;
  }
}

}  // namespace

int64_t box_volume(const Box& box) {
  int64_t v = 1;
  for (int64_t s : box.shape) v *= s;
  return v;
}

std::string box_string(const Box& box) {
  std::string s = "[";
  for (size_t d = 0; d < box.shape.size(); ++d) {
    if (d) s += ", ";
    int64_t o = d < box.offset.size() ? box.offset[d] : 0;
    s += std::to_string(o) + ":" + std::to_string(o + box.shape[d]);
  }
  return s + "]";
}

std::optional<Box> intersect(const Box& a, const Box& b) {
  FP8TRON_CHECK(a.shape.size() == b.shape.size(), "intersecting boxes of different ranks");
  Box out{std::vector<int64_t>(a.shape.size()), std::vector<int64_t>(a.shape.size())};
  for (size_t d = 0; d < a.shape.size(); ++d) {
    int64_t lo = std::max(a.offset[d], b.offset[d]);
    int64_t hi = std::min(a.offset[d] + a.shape[d], b.offset[d] + b.shape[d]);
    if (hi <= lo) return std::nullopt;
    out.offset[d] = lo;
    out.shape[d] = hi - lo;
  }
  return out;
}

Box whole(const std::vector<int64_t>& shape) { return Box{std::vector<int64_t>(shape.size(), 0), shape}; }

std::vector<CopyOp> plan_copies(const std::string& tensor_name,
                                const std::vector<int64_t>& global_shape,
                                const std::vector<Box>& sources, const Box& target) {
  check_box(tensor_name, global_shape, target, "the requested region");
  for (const auto& s : sources) check_box(tensor_name, global_shape, s, "saved shard");
  std::vector<CopyOp> ops;
  if (box_volume(target) == 0) return ops;

  // Sources that contribute: first copy of identical boxes only, non-empty intersection.
  std::vector<size_t> used;
  std::vector<Box> pieces;
  for (size_t i = 0; i < sources.size(); ++i) {
    bool replica = false;
    for (size_t j = 0; j < i && !replica; ++j) replica = sources[j] == sources[i];
    if (replica) continue;
    auto piece = intersect(sources[i], target);
    if (!piece) continue;
    for (size_t k = 0; k < pieces.size(); ++k) {
      if (auto both = intersect(pieces[k], *piece))
        throw UserError(strprintf("tensor '%s': saved shards %s and %s overlap in %s; the "
                                  "checkpoint's tensor table is corrupt",
                                  tensor_name.c_str(), box_string(sources[used[k]]).c_str(),
                                  box_string(sources[i]).c_str(), box_string(*both).c_str()));
    }
    used.push_back(i);
    pieces.push_back(*piece);
  }

  int64_t covered = 0;
  for (const auto& p : pieces) covered += box_volume(p);
  if (covered != box_volume(target)) {
    Box hole = find_uncovered(target, pieces);
    throw UserError(strprintf("tensor '%s': region %s of the needed %s is in no saved shard "
                              "(%lld of %lld elements missing); the checkpoint lacks shards "
                              "(a missing or partial rank file?)",
                              tensor_name.c_str(), box_string(hole).c_str(),
                              box_string(target).c_str(),
                              (long long)(box_volume(target) - covered),
                              (long long)box_volume(target)));
  }

  for (size_t k = 0; k < pieces.size(); ++k) {
    const Box& src = sources[used[k]];
    CopyOp op;
    op.source = used[k];
    op.shape = pieces[k].shape;
    for (size_t d = 0; d < op.shape.size(); ++d) {
      op.src_offset.push_back(pieces[k].offset[d] - src.offset[d]);
      op.dst_offset.push_back(pieces[k].offset[d] - target.offset[d]);
    }
    ops.push_back(std::move(op));
  }
  return ops;
}

void copy_box(const void* src, const std::vector<int64_t>& src_shape,
              const std::vector<int64_t>& src_offset, void* dst,
              const std::vector<int64_t>& dst_shape, const std::vector<int64_t>& dst_offset,
              const std::vector<int64_t>& extent, size_t elem_size) {
  const size_t n = extent.size();
  FP8TRON_CHECK(src_shape.size() == n && src_offset.size() == n && dst_shape.size() == n &&
                    dst_offset.size() == n,
                "copy_box: rank mismatch");
  for (size_t d = 0; d < n; ++d) {
    FP8TRON_CHECK(extent[d] >= 0 && src_offset[d] >= 0 && dst_offset[d] >= 0 &&
                      src_offset[d] + extent[d] <= src_shape[d] &&
                      dst_offset[d] + extent[d] <= dst_shape[d],
                  "copy_box: block out of bounds in dim " + std::to_string(d));
    if (extent[d] == 0) return;
  }
  auto* s = static_cast<const char*>(src);
  auto* t = static_cast<char*>(dst);
  if (n == 0) {
    std::memcpy(t, s, elem_size);
    return;
  }
  // Element strides of both arrays.
  std::vector<int64_t> ss(n, 1), ds(n, 1);
  for (size_t d = n - 1; d > 0; --d) {
    ss[d - 1] = ss[d] * src_shape[d];
    ds[d - 1] = ds[d] * dst_shape[d];
  }
  // Dims after `k` span whole rows in both arrays: the block from dim k on is one memcpy.
  size_t k = n - 1;
  while (k > 0 && extent[k] == src_shape[k] && extent[k] == dst_shape[k]) --k;
  const size_t run = size_t(extent[k] * ss[k]) * elem_size;  // ss[k] == ds[k] here
  int64_t s0 = 0, d0 = 0;
  for (size_t d = 0; d < n; ++d) {
    s0 += src_offset[d] * ss[d];
    d0 += dst_offset[d] * ds[d];
  }
  std::vector<int64_t> idx(k, 0);
  for (;;) {
    int64_t so = s0, dof = d0;
    for (size_t d = 0; d < k; ++d) {
      so += idx[d] * ss[d];
      dof += idx[d] * ds[d];
    }
    std::memcpy(t + size_t(dof) * elem_size, s + size_t(so) * elem_size, run);
    size_t d = k;
    while (d > 0) {
      --d;
      if (++idx[d] < extent[d]) break;
      idx[d] = 0;
      if (d == 0) return;
    }
    if (k == 0) return;
  }
}

void execute_copies(const std::vector<CopyOp>& ops, const std::vector<SourceArray>& sources,
                    void* dst, const std::vector<int64_t>& dst_shape, size_t elem_size) {
  for (const auto& op : ops) {
    FP8TRON_CHECK(op.source < sources.size(), "copy from a source that was not given");
    const auto& src = sources[op.source];
    copy_box(src.data, src.shape, op.src_offset, dst, dst_shape, op.dst_offset, op.shape, elem_size);
  }
}

namespace {

void flat_boxes(const std::vector<int64_t>& shape, size_t d, std::vector<int64_t>& prefix,
                int64_t b, int64_t e, std::vector<Box>& out) {
  if (b >= e) return;
  const size_t n = shape.size();
  int64_t inner = 1;
  for (size_t i = d + 1; i < n; ++i) inner *= shape[i];
  auto emit_rows = [&](int64_t r0, int64_t r1) {  // whole rows [r0, r1) of dim d
    if (r1 <= r0) return;
    Box box;
    box.offset = prefix;
    box.offset.push_back(r0);
    box.shape.assign(d, 1);
    box.shape.push_back(r1 - r0);
    for (size_t i = d + 1; i < n; ++i) {
      box.offset.push_back(0);
      box.shape.push_back(shape[i]);
    }
    out.push_back(std::move(box));
  };
  auto recurse_row = [&](int64_t row, int64_t rb, int64_t re) {
    prefix.push_back(row);
    flat_boxes(shape, d + 1, prefix, rb, re, out);
    prefix.pop_back();
  };
  int64_t first = b / inner, last = (e - 1) / inner;
  if (first == last && (b % inner != 0 || e % inner != 0)) {
    recurse_row(first, b - first * inner, e - first * inner);
    return;
  }
  int64_t full_begin = first;
  if (b % inner != 0) {
    recurse_row(first, b % inner, inner);
    full_begin = first + 1;
  }
  int64_t full_end = e / inner;
  emit_rows(full_begin, full_end);
  if (e % inner != 0) recurse_row(full_end, 0, e % inner);
}

}  // namespace

std::vector<Box> flat_range_to_boxes(const Box& box, int64_t begin, int64_t end) {
  const int64_t volume = box_volume(box);
  if (begin < 0 || end < begin || end > volume)
    throw UserError(strprintf("flat range [%lld, %lld) is outside a box of %lld elements",
                              (long long)begin, (long long)end, (long long)volume));
  std::vector<Box> out;
  if (begin == end) return out;
  if (box.shape.empty()) return {box};
  std::vector<int64_t> prefix;
  flat_boxes(box.shape, 0, prefix, begin, end, out);
  for (auto& b : out)
    for (size_t d = 0; d < b.offset.size(); ++d) b.offset[d] += box.offset[d];
  return out;
}

Box split_box(const std::vector<int64_t>& global_shape, size_t dim, int64_t rank, int64_t parts) {
  FP8TRON_CHECK(dim < global_shape.size() && parts > 0 && rank >= 0 && rank < parts,
                "split_box: bad dim/rank/parts");
  Box box = whole(global_shape);
  int64_t piece = (global_shape[dim] + parts - 1) / parts;
  int64_t lo = std::min(global_shape[dim], rank * piece);
  int64_t hi = std::min(global_shape[dim], lo + piece);
  box.offset[dim] = lo;
  box.shape[dim] = hi - lo;
  return box;
}

}  // namespace fp8tron::checkpoint
