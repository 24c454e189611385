// Loading into a different parallel layout, as pure functions on N-d boxes.
//
// A saved global tensor is a set of shards, each a box (offset + shape) of the global index
// space stored row-major somewhere. A rank of the new layout needs one box of it. plan_copies
// intersects that box with every shard and returns the copies that fill it exactly once,
// after checking that the shards cover it (an error names the tensor and an uncovered region)
// and do not partly overlap (identical boxes are replicas: the first listed is used).
// execute_copies / copy_box perform them on raw bytes (the CPU path and tests).
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace fp8tron::checkpoint {

struct Box {
  std::vector<int64_t> offset;
  std::vector<int64_t> shape;
  bool operator==(const Box&) const = default;
};

int64_t box_volume(const Box& box);
std::string box_string(const Box& box);  // "[0:4, 8:16]" (half-open ranges per dim)
std::optional<Box> intersect(const Box& a, const Box& b);  // nullopt when empty
Box whole(const std::vector<int64_t>& shape);               // offset 0, that shape

// One copy: the block `shape` at `src_offset` inside source `source`'s local array goes to
// `dst_offset` inside the destination's local array.
struct CopyOp {
  size_t source = 0;
  std::vector<int64_t> src_offset;
  std::vector<int64_t> dst_offset;
  std::vector<int64_t> shape;
  bool operator==(const CopyOp&) const = default;
};

// `sources` are the saved shards' boxes in global coordinates; `target` is the box wanted.
// Throws UserError naming `tensor_name` when a box falls outside `global_shape`, when shards
// partly overlap, or when part of `target` is covered by no shard.
std::vector<CopyOp> plan_copies(const std::string& tensor_name,
                                const std::vector<int64_t>& global_shape,
                                const std::vector<Box>& sources, const Box& target);

// Copies the block `extent` from `src` (a row-major array of `src_shape`) at `src_offset` to
// `dst` (row-major `dst_shape`) at `dst_offset`; elements of `elem_size` bytes. Contiguous
// trailing dimensions are merged into single memcpys.
void copy_box(const void* src, const std::vector<int64_t>& src_shape,
              const std::vector<int64_t>& src_offset, void* dst,
              const std::vector<int64_t>& dst_shape, const std::vector<int64_t>& dst_offset,
              const std::vector<int64_t>& extent, size_t elem_size);

struct SourceArray {
  const void* data = nullptr;       // the shard's bytes, row-major
  std::vector<int64_t> shape;       // the shard's box shape
};
void execute_copies(const std::vector<CopyOp>& ops, const std::vector<SourceArray>& sources,
                    void* dst, const std::vector<int64_t>& dst_shape, size_t elem_size);

// The elements [begin, end) of `box` in row-major order as a list of boxes (at most
// 2 * rank - 1), in that order: a flat range of a box, as the distributed optimizer holds,
// described in box terms. Each returned box's elements follow the previous one's in the range.
std::vector<Box> flat_range_to_boxes(const Box& box, int64_t begin, int64_t end);

// The box rank `rank` of `parts` holds when `global_shape` is split along `dim` into pieces of
// ceil(size / parts) (the last ones shorter or empty when it does not divide).
Box split_box(const std::vector<int64_t>& global_shape, size_t dim, int64_t rank, int64_t parts);

}  // namespace fp8tron::checkpoint
