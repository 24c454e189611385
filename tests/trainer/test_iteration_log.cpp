#include <gtest/gtest.h>

#include <regex>

#include "trainer/logging/iteration_log.h"

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

}  // namespace fp8tron
