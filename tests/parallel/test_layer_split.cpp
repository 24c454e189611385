#include <gtest/gtest.h>

#include "core/error.h"
#include "parallel/layer_split.h"
#include "tests/test_helpers.h"

namespace fp8tron {

std::vector<std::pair<int64_t, int64_t>> ranges(int64_t layers, int pp, int rank, int chunks, std::optional<int64_t> first = {},
                                                std::optional<int64_t> last = {}) {
  std::vector<std::pair<int64_t, int64_t>> out;
  for (auto r : split_layers(layers, pp, rank, chunks, first, last)) out.emplace_back(r.first, r.count);
  return out;
}

TEST(LayerSplit, EvenStages) {
  EXPECT_EQ(ranges(8, 2, 0, 1), (std::vector<std::pair<int64_t, int64_t>>{{0, 4}}));
  EXPECT_EQ(ranges(8, 2, 1, 1), (std::vector<std::pair<int64_t, int64_t>>{{4, 4}}));
}

// Virtual stage = chunk x pp + rank: rank 0 holds layers 0-1 and 4-5 of 8 with pp 2 x 2 chunks.
TEST(LayerSplit, Interleaved) {
  EXPECT_EQ(ranges(8, 2, 0, 2), (std::vector<std::pair<int64_t, int64_t>>{{0, 2}, {4, 2}}));
  EXPECT_EQ(ranges(8, 2, 1, 2), (std::vector<std::pair<int64_t, int64_t>>{{2, 2}, {6, 2}}));
}

TEST(LayerSplit, UnevenFirstAndLast) {
  EXPECT_EQ(ranges(10, 4, 0, 1, 1, 3), (std::vector<std::pair<int64_t, int64_t>>{{0, 1}}));
  EXPECT_EQ(ranges(10, 4, 1, 1, 1, 3), (std::vector<std::pair<int64_t, int64_t>>{{1, 3}}));
  EXPECT_EQ(ranges(10, 4, 2, 1, 1, 3), (std::vector<std::pair<int64_t, int64_t>>{{4, 3}}));
  EXPECT_EQ(ranges(10, 4, 3, 1, 1, 3), (std::vector<std::pair<int64_t, int64_t>>{{7, 3}}));
  EXPECT_USER_ERROR(split_layers(10, 4, 0, 1, 2, 3), "do not split evenly");
  EXPECT_USER_ERROR(split_layers(9, 4, 0, 2, {}, {}), "not divisible by the 8 pipeline stages");
}

}  // namespace fp8tron
