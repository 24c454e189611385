// Resharding on load: saved shards (boxes) to the box a rank of another layout needs, checked
// element by element against a reference that indexes the global tensor directly.
#include "checkpoint/resharding.h"

#include <gtest/gtest.h>

#include <random>

#include "core/error.h"
#include "tests/checkpoint/error_text.h"

namespace fp8tron::checkpoint {
namespace {

using testing::error_of;

using Dims = std::vector<int64_t>;

int64_t numel(const Dims& s) {
  int64_t n = 1;
  for (auto d : s) n *= d;
  return n;
}

// Element value = its flat index in the global tensor, so any misplacement shows.
std::vector<int32_t> iota_tensor(const Dims& shape) {
  std::vector<int32_t> v(size_t(numel(shape)));
  for (size_t i = 0; i < v.size(); ++i) v[i] = int32_t(i);
  return v;
}

// The box of a row-major global tensor, by direct indexing (the reference).
std::vector<int32_t> extract(const std::vector<int32_t>& global, const Dims& gshape, const Box& box) {
  std::vector<int32_t> out(size_t(box_volume(box)));
  const size_t n = gshape.size();
  for (int64_t k = 0; k < int64_t(out.size()); ++k) {
    int64_t rem = k, flat = 0, stride = 1;
    std::vector<int64_t> idx(n);
    for (size_t d = n; d-- > 0;) {
      idx[d] = rem % box.shape[d];
      rem /= box.shape[d];
    }
    for (size_t d = n; d-- > 0;) {
      flat += (box.offset[d] + idx[d]) * stride;
      stride *= gshape[d];
    }
    out[size_t(k)] = global[size_t(flat)];
  }
  return out;
}

// Saves `sources` out of the iota tensor, loads `target` through plan + execute.
std::vector<int32_t> reshard(const Dims& gshape, const std::vector<Box>& sources, const Box& target,
                             size_t* num_ops = nullptr) {
  auto global = iota_tensor(gshape);
  std::vector<std::vector<int32_t>> saved;
  std::vector<SourceArray> arrays;
  for (const auto& s : sources) saved.push_back(extract(global, gshape, s));
  for (size_t i = 0; i < sources.size(); ++i) arrays.push_back({saved[i].data(), sources[i].shape});
  auto ops = plan_copies("t", gshape, sources, target);
  if (num_ops) *num_ops = ops.size();
  std::vector<int32_t> out(size_t(box_volume(target)), -1);
  execute_copies(ops, arrays, out.data(), target.shape, sizeof(int32_t));
  return out;
}

void expect_reshard(const Dims& gshape, const std::vector<Box>& sources, const Box& target) {
  auto got = reshard(gshape, sources, target);
  EXPECT_EQ(got, extract(iota_tensor(gshape), gshape, target)) << "target " << box_string(target);
}

std::vector<Box> split(const Dims& gshape, size_t dim, int64_t parts) {
  std::vector<Box> out;
  for (int64_t r = 0; r < parts; ++r) out.push_back(split_box(gshape, dim, r, parts));
  return out;
}

TEST(Resharding, BoxBasics) {
  Box a{{0, 2}, {4, 4}}, b{{2, 0}, {4, 3}};
  EXPECT_EQ(box_string(a), "[0:4, 2:6]");
  EXPECT_EQ(*intersect(a, b), (Box{{2, 2}, {2, 1}}));
  EXPECT_FALSE(intersect(a, Box{{4, 0}, {1, 1}}).has_value());
  EXPECT_EQ(box_volume(a), 16);
  EXPECT_EQ(split_box({10, 3}, 0, 3, 4), (Box{{9, 0}, {1, 3}}));
  EXPECT_EQ(split_box({2, 3}, 0, 3, 4), (Box{{2, 0}, {0, 3}}));  // more parts than rows: empty
}

TEST(Resharding, Tp2ToTp1) {
  // Column-parallel weight split along the output dim, row-parallel along the input dim.
  expect_reshard({8, 6}, split({8, 6}, 0, 2), whole({8, 6}));
  expect_reshard({8, 6}, split({8, 6}, 1, 2), whole({8, 6}));
  size_t ops = 0;
  reshard({8, 6}, split({8, 6}, 0, 2), whole({8, 6}), &ops);
  EXPECT_EQ(ops, 2u);
}

TEST(Resharding, Tp1ToTp4) {
  for (size_t dim : {0u, 1u})
    for (const Box& target : split({8, 12}, dim, 4)) {
      expect_reshard({8, 12}, {whole({8, 12})}, target);
      size_t ops = 0;
      reshard({8, 12}, {whole({8, 12})}, target, &ops);
      EXPECT_EQ(ops, 1u);
    }
}

TEST(Resharding, Tp2ToTp4AndBack) {
  for (const Box& target : split({16, 4}, 0, 4)) expect_reshard({16, 4}, split({16, 4}, 0, 2), target);
  for (const Box& target : split({16, 4}, 0, 2)) expect_reshard({16, 4}, split({16, 4}, 0, 4), target);
}

TEST(Resharding, TwoDimensionalGrids) {
  // Saved as a 2 x 3 grid (e.g. TP x expert split), loaded as a 3 x 2 grid.
  const Dims g = {6, 9};
  std::vector<Box> saved;
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 3; ++j) saved.push_back(Box{{3 * i, 3 * j}, {3, 3}});
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 2; ++j) {
      Box target{{2 * i, j == 0 ? 0 : 5}, {2, j == 0 ? 5 : 4}};
      expect_reshard(g, saved, target);
    }
  // 3-D: split on dims 0 and 2, loaded split on dim 1.
  const Dims g3 = {4, 6, 8};
  std::vector<Box> saved3;
  for (int i = 0; i < 2; ++i)
    for (int k = 0; k < 2; ++k) saved3.push_back(Box{{2 * i, 0, 4 * k}, {2, 6, 4}});
  for (const Box& target : split(g3, 1, 3)) expect_reshard(g3, saved3, target);
}

TEST(Resharding, UnevenSplits) {
  const Dims g = {10, 3};
  std::vector<Box> saved = {Box{{0, 0}, {3, 3}}, Box{{3, 0}, {4, 3}}, Box{{7, 0}, {3, 3}}};
  expect_reshard(g, saved, Box{{0, 0}, {5, 3}});
  expect_reshard(g, saved, Box{{5, 0}, {5, 3}});
  expect_reshard(g, saved, Box{{2, 1}, {6, 1}});
  for (const Box& target : split(g, 0, 4)) expect_reshard(g, saved, target);  // 3, 3, 3, 1
  expect_reshard(g, split(g, 0, 4), whole(g));
}

TEST(Resharding, MissingShardNamesTheRegion) {
  const Dims g = {8, 6};
  std::vector<Box> saved = split(g, 0, 4);
  saved.erase(saved.begin() + 2);  // rows 4:6 lost
  std::string msg = error_of([&] { plan_copies("decoder.layers.3.mlp.fc1.weight", g, saved, whole(g)); });
  EXPECT_NE(msg.find("tensor 'decoder.layers.3.mlp.fc1.weight': region [4:6, 0:6] of the needed "
                     "[0:8, 0:6] is in no saved shard (12 of 48 elements missing)"),
            std::string::npos) << msg;
  // A target that avoids the hole still loads.
  expect_reshard(g, saved, Box{{0, 0}, {4, 6}});
  // 2-D hole.
  std::vector<Box> grid = {Box{{0, 0}, {4, 3}}, Box{{0, 3}, {4, 3}}, Box{{4, 0}, {4, 3}}};
  msg = error_of([&] { plan_copies("w", g, grid, Box{{2, 2}, {6, 4}}); });
  EXPECT_NE(msg.find("region [4:8, 3:6]"), std::string::npos) << msg;
  msg = error_of([&] { plan_copies("w", g, {}, whole(g)); });
  EXPECT_NE(msg.find("48 of 48 elements missing"), std::string::npos) << msg;
}

TEST(Resharding, ReplicatedShardsAreReadOnce) {
  const Dims g = {4, 4};
  // A layernorm-like tensor held whole by every TP rank, and a split one held by two DP replicas.
  std::vector<Box> replicated = {whole(g), whole(g), whole(g)};
  size_t ops = 0;
  auto got = reshard(g, replicated, whole(g), &ops);
  EXPECT_EQ(ops, 1u);
  EXPECT_EQ(got, iota_tensor(g));
  std::vector<Box> dp_replicas = split(g, 0, 2);
  auto copy = dp_replicas;
  dp_replicas.insert(dp_replicas.end(), copy.begin(), copy.end());
  auto plan = plan_copies("t", g, dp_replicas, whole(g));
  ASSERT_EQ(plan.size(), 2u);
  EXPECT_EQ(plan[0].source, 0u);
  EXPECT_EQ(plan[1].source, 1u);
  // A partial overlap is corruption, not replication.
  std::string msg = error_of([&] { plan_copies("t", g, {Box{{0, 0}, {3, 4}}, Box{{2, 0}, {2, 4}}}, whole(g)); });
  EXPECT_NE(msg.find("saved shards [0:3, 0:4] and [2:4, 0:4] overlap in [2:3, 0:4]"), std::string::npos) << msg;
}

TEST(Resharding, BadBoxes) {
  EXPECT_NE(error_of([] { plan_copies("t", {4}, {Box{{2}, {4}}}, whole({4})); }).find("lies outside"), std::string::npos);
  EXPECT_NE(error_of([] { plan_copies("t", {4}, {whole({4})}, Box{{-1}, {2}}); }).find("requested region"), std::string::npos);
  EXPECT_NE(error_of([] { plan_copies("t", {4, 4}, {whole({4})}, whole({4, 4})); }).find("dims"), std::string::npos);
}

TEST(Resharding, ScalarsAndEmptyTensors) {
  expect_reshard({}, {whole({})}, whole({}));
  EXPECT_TRUE(plan_copies("t", {0, 5}, {}, whole({0, 5})).empty());
  EXPECT_TRUE(plan_copies("t", {4, 5}, {}, Box{{1, 1}, {0, 3}}).empty());
  EXPECT_NE(error_of([] { plan_copies("t", {}, {}, whole({})); }).find("1 of 1 elements missing"), std::string::npos);
}

TEST(Resharding, FlatRangeToBoxesCoversTheRangeInOrder) {
  for (const Dims& shape : {Dims{7}, Dims{3, 4}, Dims{2, 3, 4}, Dims{2, 1, 3, 2}}) {
    Box box{Dims(shape.size(), 1), shape};  // a box not at the origin
    Dims gshape = shape;
    for (auto& d : gshape) d += 2;
    const int64_t n = numel(shape);
    auto global = iota_tensor(gshape);
    auto flat = extract(global, gshape, box);  // the box's elements in row-major order
    for (int64_t b = 0; b <= n; ++b)
      for (int64_t e = b; e <= n; ++e) {
        auto pieces = flat_range_to_boxes(box, b, e);
        EXPECT_LE(pieces.size(), std::max<size_t>(1, 2 * shape.size() - 1));
        std::vector<int32_t> joined;
        for (const auto& p : pieces) {
          auto part = extract(global, gshape, p);
          joined.insert(joined.end(), part.begin(), part.end());
        }
        EXPECT_EQ(joined, std::vector<int32_t>(flat.begin() + b, flat.begin() + e))
            << box_string(box) << " [" << b << ", " << e << ")";
      }
  }
  EXPECT_THROW(flat_range_to_boxes(whole({3}), 2, 4), UserError);
}

TEST(Resharding, DistributedOptimizerFlatShardsToTensorParallel) {
  // A [5, 7] parameter's optimizer state split flat over 3 DP ranks: [0, 12), [12, 24), [24, 35).
  const Dims g = {5, 7};
  auto global = iota_tensor(g);
  std::vector<Box> boxes;
  std::vector<SourceArray> arrays;
  const int64_t cuts[] = {0, 12, 24, 35};
  for (int r = 0; r < 3; ++r) {
    int64_t element = 0;
    for (const Box& piece : flat_range_to_boxes(whole(g), cuts[r], cuts[r + 1])) {
      boxes.push_back(piece);
      // The rank stored global[cuts[r]:cuts[r+1]] as one flat tensor; this piece starts
      // `element` elements into it.
      arrays.push_back({global.data() + cuts[r] + element, piece.shape});
      element += box_volume(piece);
    }
  }
  for (const Box& target : split(g, 1, 2)) {
    auto ops = plan_copies("exp_avg", g, boxes, target);
    std::vector<int32_t> out(size_t(box_volume(target)), -1);
    execute_copies(ops, arrays, out.data(), target.shape, sizeof(int32_t));
    EXPECT_EQ(out, extract(global, g, target));
  }
}

TEST(Resharding, CopyBoxMatchesReferenceOnRandomBlocks) {
  std::mt19937 rng(1234);
  for (int trial = 0; trial < 300; ++trial) {
    size_t n = 1 + rng() % 4;
    Dims src_shape(n), dst_shape(n), extent(n), so(n), dof(n);
    for (size_t d = 0; d < n; ++d) {
      extent[d] = 1 + rng() % 4;
      src_shape[d] = extent[d] + rng() % 3;
      dst_shape[d] = extent[d] + rng() % 3;
      so[d] = rng() % (src_shape[d] - extent[d] + 1);
      dof[d] = rng() % (dst_shape[d] - extent[d] + 1);
    }
    auto src = iota_tensor(src_shape);
    std::vector<int32_t> dst(size_t(numel(dst_shape)), -1), want = dst;
    copy_box(src.data(), src_shape, so, dst.data(), dst_shape, dof, extent, sizeof(int32_t));
    // Reference: element by element.
    auto block = extract(src, src_shape, Box{so, extent});
    for (int64_t k = 0; k < numel(extent); ++k) {
      int64_t rem = k, flat = 0, stride = 1;
      Dims idx(n);
      for (size_t d = n; d-- > 0;) {
        idx[d] = rem % extent[d];
        rem /= extent[d];
      }
      for (size_t d = n; d-- > 0;) {
        flat += (dof[d] + idx[d]) * stride;
        stride *= dst_shape[d];
      }
      want[size_t(flat)] = block[size_t(k)];
    }
    ASSERT_EQ(dst, want) << "trial " << trial;
  }
}

TEST(Resharding, RandomGridsToRandomTargets) {
  std::mt19937 rng(99);
  for (int trial = 0; trial < 200; ++trial) {
    size_t n = 1 + rng() % 3;
    Dims g(n);
    for (auto& d : g) d = 1 + rng() % 9;
    // Random cut points per dim make an uneven grid of saved shards.
    std::vector<std::vector<int64_t>> cuts(n);
    for (size_t d = 0; d < n; ++d) {
      cuts[d] = {0, g[d]};
      for (int c = 0; c < 3; ++c) cuts[d].push_back(rng() % (g[d] + 1));
      std::sort(cuts[d].begin(), cuts[d].end());
      cuts[d].erase(std::unique(cuts[d].begin(), cuts[d].end()), cuts[d].end());
    }
    std::vector<Box> saved;
    std::vector<size_t> idx(n, 0);
    for (bool done = false; !done;) {
      Box b{Dims(n), Dims(n)};
      for (size_t d = 0; d < n; ++d) {
        b.offset[d] = cuts[d][idx[d]];
        b.shape[d] = cuts[d][idx[d] + 1] - cuts[d][idx[d]];
      }
      saved.push_back(b);
      size_t d = n;
      done = true;
      while (d-- > 0) {
        if (++idx[d] + 1 < cuts[d].size()) {
          done = false;
          break;
        }
        idx[d] = 0;
      }
    }
    std::shuffle(saved.begin(), saved.end(), rng);
    Box target{Dims(n), Dims(n)};
    for (size_t d = 0; d < n; ++d) {
      target.offset[d] = rng() % g[d];
      target.shape[d] = 1 + rng() % (g[d] - target.offset[d]);
    }
    expect_reshard(g, saved, target);
  }
}

}  // namespace
}  // namespace fp8tron::checkpoint
