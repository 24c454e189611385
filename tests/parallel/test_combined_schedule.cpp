// The combined 1F1B schedule's order (--overlap-moe-expert-parallel-comm): which micro-batches
// pair up, and how the two sides of a pair take turns at the all-to-alls.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/deferred_work.h"
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

// A side that throws ends the pair; the other side stops at its next hand-over instead of going
// on alone (it would issue its all-to-alls out of the order the other ranks issue theirs), and the
// first error is what the pair rethrows.
TEST(CombinedSchedule, ASideThatThrowsEndsThePairAndRethrows) {
  AllToAllTurns turns;
  bool other_started = false;
  try {
    turns.run_pair([&] { throw std::runtime_error("backward failed"); }, [&] { other_started = true; },
                   torch::Device(torch::kCPU));
    ADD_FAILURE() << "run_pair did not rethrow";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "backward failed");
  }
  EXPECT_FALSE(other_started);
}

TEST(CombinedSchedule, TheOtherSideStopsAtItsNextHandOverWhenOneFails) {
  AllToAllTurns turns;
  std::vector<std::string> log;
  try {
    turns.run_pair(
        [&] {
          log.push_back("b:combine");
          turns.pass_turn();  // the forward side fails meanwhile: PartnerFailed here
          log.push_back("b:experts");
        },
        [&] {
          log.push_back("f:attention");
          throw std::runtime_error("token id 700 is outside the vocabulary");
        },
        torch::Device(torch::kCPU));
    ADD_FAILURE() << "run_pair did not rethrow";
  } catch (const PartnerFailed&) {
    ADD_FAILURE() << "the partner's stop was rethrown instead of the error";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "token id 700 is outside the vocabulary");
  }
  EXPECT_EQ(log, (std::vector<std::string>{"b:combine", "f:attention"}));
  // The pair is over: the next one runs normally.
  int ran = 0;
  turns.run_pair([&] { ++ran; }, [&] { ++ran; }, torch::Device(torch::kCPU));
  EXPECT_EQ(ran, 2);
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


// --delay-wgrad-compute: the weight gradients a backward pass holds run at its next all-to-all,
// after the issue and before the turn passes (beside its own exchange, as Megatron's backward_dw:
// the experts' beside the dispatch's backward all-to-all, the attention's beside the next layer's
// combine), and what is left at the pass's end before the pass ends. The forward side never finds
// held work.
TEST(CombinedSchedule, HeldWeightGradientsRunBehindTheBackwardsOwnAllToAll) {
  auto turns = std::make_shared<AllToAllTurns>();
  DeferredWork held;
  std::vector<std::string> log;
  TurnAtAllToAll observer(turns, nullptr, [&] {
    if (!held.empty()) log.push_back("run held");
    held.run();
  });
  struct Done : CommWork {
    void wait() override {}
  } done;
  auto all_to_all = [&](const std::string& what) {
    log.push_back(what);
    observer.wait(done);
  };
  auto compute = [&](const std::string& what, const std::string& held_wgrad = "") {
    log.push_back(what);
    if (!held_wgrad.empty()) held.hold([&log, held_wgrad] { log.push_back(held_wgrad); }, {});
  };
  turns->run_pair(
      [&] {
        all_to_all("b:combine L1");
        compute("b:experts dgrad L1", "b:experts wgrad L1");
        all_to_all("b:dispatch L1");
        compute("b:attention dgrad L1", "b:attention wgrad L1");
        all_to_all("b:combine L0");
        compute("b:experts dgrad L0", "b:experts wgrad L0");
        all_to_all("b:dispatch L0");
        compute("b:attention dgrad L0", "b:attention wgrad L0");
        held.run();  // the schedule's after_backward
      },
      [&] {
        compute("f:attention L0");
        all_to_all("f:dispatch L0");
        compute("f:experts L0");
        all_to_all("f:combine L0");
        compute("f:attention L1");
        all_to_all("f:dispatch L1");
        compute("f:experts L1");
        all_to_all("f:combine L1");
        compute("f:loss");
      },
      torch::Device(torch::kCPU));
  const std::vector<std::string> expected = {
      "b:combine L1",       "f:attention L0",       "f:dispatch L0",        "b:experts dgrad L1",
      "b:dispatch L1",      "run held",             "b:experts wgrad L1",   "f:experts L0",
      "f:combine L0",       "b:attention dgrad L1", "b:combine L0",         "run held",
      "b:attention wgrad L1", "f:attention L1",     "f:dispatch L1",        "b:experts dgrad L0",
      "b:dispatch L0",      "run held",             "b:experts wgrad L0",   "f:experts L1",
      "f:combine L1",       "b:attention dgrad L0", "b:attention wgrad L0", "f:loss"};
  EXPECT_EQ(log, expected);
  EXPECT_EQ(held.held(), 4);
  EXPECT_EQ(held.ran(), 4);
}

// The schedule runs `after_backward` at the end of every backward pass, before the next one.
TEST(CombinedSchedule, AfterBackwardEndsEveryBackwardPass) {
  AllToAllTurns turns;
  auto w = torch::ones({}, torch::requires_grad());
  std::vector<std::string> log;
  run_combined_1f1b(
      3,
      [&](int64_t mb) {
        log.push_back("f" + std::to_string(mb));
        return w * double(mb + 1);
      },
      1.0, {}, turns, torch::Device(torch::kCPU),
      [&] { log.push_back("after b, grad " + std::to_string(int(w.grad().item<double>()))); });
  EXPECT_EQ(log, (std::vector<std::string>{"f0", "after b, grad 1", "f1", "after b, grad 3", "f2", "after b, grad 6"}));
}

}  // namespace
}  // namespace fp8tron
