#include <gtest/gtest.h>

#include <regex>

#include "trainer/logging/iteration_log.h"
#include "trainer/logging/timers.h"

namespace fp8tron {

TEST(IterationLog, MegatronFieldsInOrder) {
  IterationStats s;
  s.iteration = 10;
  s.train_iters = 100;
  s.consumed_samples = 320;
  s.elapsed_ms_per_iteration = 123.456;
  s.tflops_per_gpu = 45.67;
  s.learning_rate = 1e-4;
  s.global_batch_size = 32;
  s.lm_loss = 1.234567;
  s.loss_scale = 1.0;
  s.grad_norm = 0.5;
  s.skipped_iterations = 1;
  s.nan_iterations = 0;
  s.tokens_per_second = 65536;
  const std::string line = format_iteration_line(s);
  const std::regex expected(
      R"(^ \[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\] iteration       10/     100 \| consumed samples:          320 \| )"
      R"(elapsed time per iteration \(ms\): 123\.5 \| throughput per GPU \(TFLOP/s/GPU\): 45\.7 \| )"
      R"(learning rate: 1\.000000E-04 \| global batch size:    32 \| lm loss: 1\.234567E\+00 \| loss scale: 1\.0 \| )"
      R"(grad norm: 0\.500 \| number of skipped iterations:   1 \| number of nan iterations:   0 \| )"
      R"(tokens per second: 65536 \|$)");
  EXPECT_TRUE(std::regex_match(line, expected)) << line;
  s.tflops_per_gpu.reset();
  EXPECT_EQ(format_iteration_line(s).find("throughput per GPU"), std::string::npos);
}

TEST(IterationLog, ValidationBlock) {
  const std::string block = format_validation_block("validation loss at iteration 100", 2.0);
  EXPECT_NE(block.find(" validation loss at iteration 100 | lm loss value: 2.000000E+00 | lm loss PPL: 7.389056E+00 | "),
            std::string::npos);
  EXPECT_EQ(block.front(), '-');
  EXPECT_EQ(block.back(), '-');
}

// Counters (the MoE dispatch all-to-all's bytes) beside the timers: per iteration over the interval,
// every rank's values gathered, printed in the --timing-log-option forms as whole numbers under a
// title of their own; nothing below the counter's level; reset by the report.
TEST(Timers, CountersReportBytesPerIterationAcrossRanks) {
  Timers timers(1, [] {});
  timers.add_count("moe-dispatch-all-to-all", 1, 6996);
  timers.add_count("moe-dispatch-all-to-all", 1, 6996);
  timers.add_count("moe-dispatch-all-to-all", 2, 1e9);  // above the level: not counted
  // Two ranks: this one's values, then the other's (10692 per iteration).
  auto gather = [](const std::vector<double>& mine) {
    std::vector<double> all = mine;
    all.push_back(10692);
    return all;
  };
  const auto r = timers.report_counts({"moe-dispatch-all-to-all"}, 2, "minmax", gather, 2);
  EXPECT_EQ(r.text,
            "(min, max) bytes per iteration across ranks:\n"
            "    moe-dispatch-all-to-all ........................: (6996, 10692)");
  ASSERT_EQ(r.max_ms.size(), 1u);
  EXPECT_EQ(r.max_ms[0].second, 10692);
  timers.add_count("moe-dispatch-all-to-all", 1, 100);
  const auto all = timers.report_counts({"moe-dispatch-all-to-all"}, 1, "all", gather, 2);
  EXPECT_EQ(all.text, "bytes per iteration across ranks:\n  moe-dispatch-all-to-all:\n     rank  0: 100\n     rank  1: 10692");
  // Reported and reset: nothing left on this rank, and the times' report is separate.
  const auto single = timers.report_counts({"moe-dispatch-all-to-all"}, 1, "max", [](const std::vector<double>& m) { return m; }, 1);
  EXPECT_EQ(single.text, "");
  EXPECT_EQ(timers.report({"moe-dispatch-all-to-all"}, 1, "minmax", gather, 1).text, "");
  Timers off(0, [] {});
  off.add_count("moe-dispatch-all-to-all", 1, 5);
  EXPECT_EQ(off.report_counts({"moe-dispatch-all-to-all"}, 1, "max", gather, 1).text, "");
}

}  // namespace fp8tron
