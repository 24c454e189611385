#include <gtest/gtest.h>

#include "data/gpt_inputs.h"
#include "data/sample_dataset.h"

namespace fp8tron::data {
namespace {

// Sample of seq_length 6 + 1 tokens with eod = 0 at inputs 2 and 4, as Megatron's
// _get_ltor_masks_and_position_ids sees it.
TEST(GptInputs, MasksAndPositionsFollowMegatron) {
  const int64_t sample[7] = {5, 6, 0, 7, 0, 8, 9};
  int64_t tokens[6], labels[6], positions[6];
  float loss[6];
  int32_t segments[6];
  make_gpt_inputs(sample, 6, 0, {}, tokens, labels, loss, positions, segments);
  EXPECT_EQ(std::vector<int64_t>(tokens, tokens + 6), (std::vector<int64_t>{5, 6, 0, 7, 0, 8}));
  EXPECT_EQ(std::vector<int64_t>(labels, labels + 6), (std::vector<int64_t>{6, 0, 7, 0, 8, 9}));
  EXPECT_EQ(std::vector<float>(loss, loss + 6), std::vector<float>(6, 1.0f));
  EXPECT_EQ(std::vector<int64_t>(positions, positions + 6), (std::vector<int64_t>{0, 1, 2, 3, 4, 5}));

  make_gpt_inputs(sample, 6, 0, {true, true, true}, tokens, labels, loss, positions, segments);
  EXPECT_EQ(std::vector<float>(loss, loss + 6), (std::vector<float>{1, 1, 0, 1, 0, 1}));
  // Positions restart after each eod; the eod belongs to the document it ends.
  EXPECT_EQ(std::vector<int64_t>(positions, positions + 6), (std::vector<int64_t>{0, 1, 2, 0, 1, 0}));
  EXPECT_EQ(std::vector<int32_t>(segments, segments + 6), (std::vector<int32_t>{0, 0, 0, 1, 1, 2}));
}

TEST(GptInputs, PaddingIsMaskedAndMappedToZero) {
  const int64_t sample[5] = {3, 4, kPadTokenId, kPadTokenId, kPadTokenId};
  int64_t tokens[4], labels[4], positions[4];
  float loss[4];
  make_gpt_inputs(sample, 4, 99, {}, tokens, labels, loss, positions, nullptr);
  EXPECT_EQ(std::vector<float>(loss, loss + 4), (std::vector<float>{1, 0, 0, 0}));
  EXPECT_EQ(std::vector<int64_t>(tokens, tokens + 4), (std::vector<int64_t>{3, 4, 0, 0}));
  EXPECT_EQ(std::vector<int64_t>(labels, labels + 4), (std::vector<int64_t>{4, 0, 0, 0}));
}

}  // namespace
}  // namespace fp8tron::data
