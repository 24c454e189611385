// The combined 1F1B schedule's order (--overlap-moe-expert-parallel-comm): which micro-batches
// pair up, and how the two sides of a pair take turns at the all-to-alls.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "parallel/all_to_all_turns.h"
#include "parallel/combined_schedule.h"

namespace fp8tron {
namespace {

TEST(CombinedSchedule, PairsEachForwardWithThePreviousBackward) {
  const auto order = combined_1f1b_order(3);
  ASSERT_EQ(order.size(), 4u);
  EXPECT_EQ(order[0].backward, -1);
  EXPECT_EQ(order[0].forward, 0);
  EXPECT_EQ(order[1].backward, 0);
  EXPECT_EQ(order[1].forward, 1);
  EXPECT_EQ(order[2].backward, 1);
  EXPECT_EQ(order[2].forward, 2);
  EXPECT_EQ(order[3].backward, 2);
  EXPECT_EQ(order[3].forward, -1);
  EXPECT_EQ(combined_1f1b_order(1).size(), 2u);  // one micro-batch: nothing to pair
  EXPECT_TRUE(combined_1f1b_order(0).empty());
}

// A layer's sub-steps as Megatron's plan orders them: the backward side starts (its combine
// all-to-all), then each side's compute runs while the other's all-to-all is pending.
TEST(CombinedSchedule, SidesAlternateAtEachAllToAll) {
  AllToAllTurns turns;
  std::vector<std::string> log;
  auto step = [&](const std::string& what, bool all_to_all) {
    log.push_back(what);
    if (all_to_all) turns.pass_turn();
  };
  turns.run_pair(
      [&] {
        step("b:combine", true);
        step("b:experts", false);
        step("b:dispatch", true);
        step("b:attention", false);
      },
      [&] {
        step("f:attention", false);
        step("f:dispatch", true);
        step("f:experts", false);
        step("f:combine", true);
        step("f:next-layer", false);
      },
      torch::Device(torch::kCPU));
  const std::vector<std::string> expected = {"b:combine", "f:attention", "f:dispatch", "b:experts", "b:dispatch",
                                             "f:experts", "f:combine",   "b:attention", "f:next-layer"};
  EXPECT_EQ(log, expected);
  EXPECT_EQ(turns.passes(), 4);
  turns.pass_turn();  // outside a pair: returns at once
  EXPECT_EQ(turns.passes(), 4);
}

TEST(CombinedSchedule, ASideThatThrowsEndsThePairAndRethrows) {
  AllToAllTurns turns;
  bool other_finished = false;
  EXPECT_THROW(turns.run_pair([&] { throw std::runtime_error("backward failed"); },
                              [&] {
                                turns.pass_turn();  // the first side has ended: no wait
                                other_finished = true;
                              },
                              torch::Device(torch::kCPU)),
               std::runtime_error);
  EXPECT_TRUE(other_finished);
}

// The losses are summed in micro-batch order and every micro-batch's backward runs once.
TEST(CombinedSchedule, RunsEveryForwardAndBackwardOnce) {
  AllToAllTurns turns;
  auto w = torch::ones({}, torch::requires_grad());
  std::vector<int64_t> forwards;
  bool armed = false;
  auto sum = run_combined_1f1b(
      3,
      [&](int64_t mb) {
        forwards.push_back(mb);
        return w * double(mb + 1);
      },
      0.5, [&] { armed = true; }, turns, torch::Device(torch::kCPU));
  EXPECT_EQ(forwards, (std::vector<int64_t>{0, 1, 2}));
  EXPECT_TRUE(armed);
  EXPECT_DOUBLE_EQ(sum.item<double>(), 6.0);
  EXPECT_DOUBLE_EQ(w.grad().item<double>(), 0.5 * 6.0);
}

}  // namespace
}  // namespace fp8tron
