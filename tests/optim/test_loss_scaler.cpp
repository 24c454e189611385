#include <gtest/gtest.h>

#include "optim/loss_scaler.h"

namespace fp8tron {

PrecisionConfig fp16(double initial = 1024, int64_t window = 3, int hysteresis = 2) {
  PrecisionConfig p;
  p.params_dtype = ParamDtype::Fp16;
  p.initial_loss_scale = initial;
  p.min_loss_scale = 1;
  p.loss_scale_window = window;
  p.hysteresis = hysteresis;
  return p;
}

TEST(LossScaler, ConstantOutsideFp16) {
  PrecisionConfig p;
  p.params_dtype = ParamDtype::Bf16;
  LossScaler s(p);
  EXPECT_FALSE(s.dynamic());
  s.update(true);
  EXPECT_EQ(s.scale(), 1.0);
}

TEST(LossScaler, StaticScale) {
  auto p = fp16();
  p.static_loss_scale = 128;
  LossScaler s(p);
  s.update(true);
  EXPECT_EQ(s.scale(), 128);
}

TEST(LossScaler, HysteresisThenBackoff) {
  LossScaler s(fp16(1024, 1000, 2));
  s.update(true);  // first overflow tolerated
  EXPECT_EQ(s.scale(), 1024);
  s.update(true);  // second halves
  EXPECT_EQ(s.scale(), 512);
  s.update(true);  // hysteresis stays exhausted until a growth: halves again
  EXPECT_EQ(s.scale(), 256);
}

TEST(LossScaler, GrowthAfterWindowAndMinimum) {
  LossScaler s(fp16(4, 3, 1));
  s.update(false);
  s.update(false);
  EXPECT_EQ(s.scale(), 4);
  s.update(false);
  EXPECT_EQ(s.scale(), 8);
  s.update(false);
  s.update(true);  // an overflow resets the growth count
  EXPECT_EQ(s.scale(), 4);
  for (int i = 0; i < 10; ++i) s.update(true);
  EXPECT_EQ(s.scale(), 1);  // never below --min-loss-scale
}

}  // namespace fp8tron
