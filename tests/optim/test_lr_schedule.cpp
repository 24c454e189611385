#include <gtest/gtest.h>

#include <cmath>

#include "optim/lr_schedule.h"

namespace fp8tron {

LrScheduleConfig schedule(DecayStyle style, int64_t warmup, int64_t decay) {
  LrScheduleConfig c;
  c.max_lr = 1.0;
  c.min_lr = 0.1;
  c.warmup_steps = warmup;
  c.decay_steps = decay;
  c.decay_style = style;
  return c;
}

TEST(LrSchedule, LinearWarmupFromInit) {
  auto c = schedule(DecayStyle::Constant, 100, 1000);
  c.init_lr = 0.5;
  LrSchedule s(c);
  EXPECT_DOUBLE_EQ(s.lr_at(0), 0.5);
  EXPECT_DOUBLE_EQ(s.lr_at(50), 0.75);
  EXPECT_DOUBLE_EQ(s.lr_at(100), 1.0);
  EXPECT_DOUBLE_EQ(s.lr_at(5000), 1.0);  // constant never decays
}

TEST(LrSchedule, LinearAndCosine) {
  LrSchedule lin(schedule(DecayStyle::Linear, 100, 1100));
  EXPECT_DOUBLE_EQ(lin.lr_at(600), 0.1 + 0.5 * 0.9);
  EXPECT_DOUBLE_EQ(lin.lr_at(1100), 0.1);
  EXPECT_DOUBLE_EQ(lin.lr_at(2000), 0.1);
  LrSchedule cos(schedule(DecayStyle::Cosine, 100, 1100));
  EXPECT_NEAR(cos.lr_at(600), 0.1 + 0.9 * 0.5, 1e-12);
  EXPECT_NEAR(cos.lr_at(350), 0.1 + 0.9 * 0.5 * (std::cos(M_PI * 0.25) + 1), 1e-12);
}

// --decoupled-lr / --decoupled-min-lr: Megatron's scheduler runs the embedding/output group on the
// same schedule with the group's max_lr and min_lr (get_lr reads them from the param group); the
// warmup starts from the common --lr-warmup-init.
TEST(LrSchedule, DecoupledGroupHasItsOwnPeakAndMinimum) {
  auto c = schedule(DecayStyle::Linear, 100, 1100);
  c.init_lr = 0.5;
  LrSchedule s(c);
  EXPECT_DOUBLE_EQ(s.lr_at(50, 2.0, 0.2), 0.5 + (2.0 - 0.5) * 0.5);
  EXPECT_DOUBLE_EQ(s.lr_at(100, 2.0, 0.2), 2.0);
  EXPECT_DOUBLE_EQ(s.lr_at(600, 2.0, 0.2), 0.2 + 0.5 * 1.8);
  EXPECT_DOUBLE_EQ(s.lr_at(2000, 2.0, 0.2), 0.2);
  // The main group is untouched by the decoupled one.
  EXPECT_DOUBLE_EQ(s.lr_at(600), 0.1 + 0.5 * 0.9);
  EXPECT_DOUBLE_EQ(s.lr_at(600, c.max_lr, c.min_lr), s.lr_at(600));
}

TEST(LrSchedule, InverseSquareRoot) {
  LrSchedule s(schedule(DecayStyle::InverseSquareRoot, 100, 100000));
  EXPECT_DOUBLE_EQ(s.lr_at(400), 0.5);  // sqrt(100) / sqrt(400)
  EXPECT_DOUBLE_EQ(s.lr_at(1000000), 0.1);
  EXPECT_DOUBLE_EQ(s.lr_at(99999), std::max(0.1, 10.0 / std::sqrt(99999.0)));
}

TEST(LrSchedule, WarmupStableDecay) {
  auto c = schedule(DecayStyle::WSD, 100, 1100);
  c.wsd_decay_steps = 200;  // anneal over [900, 1100]
  for (auto style : {WsdDecayStyle::Linear, WsdDecayStyle::Cosine, WsdDecayStyle::Exponential, WsdDecayStyle::MinusSqrt}) {
    c.wsd_decay_style = style;
    LrSchedule s(c);
    EXPECT_DOUBLE_EQ(s.lr_at(500), 1.0);
    EXPECT_DOUBLE_EQ(s.lr_at(900), 1.0);
    EXPECT_NEAR(s.lr_at(1100), 0.1, 1e-12);
  }
  c.wsd_decay_style = WsdDecayStyle::Linear;
  EXPECT_DOUBLE_EQ(LrSchedule(c).lr_at(1000), 0.1 + 0.9 * 0.5);
  c.wsd_decay_style = WsdDecayStyle::Exponential;
  EXPECT_NEAR(LrSchedule(c).lr_at(1000), 0.1 + 0.9 * (2 * std::pow(0.5, 0.5) - 1), 1e-12);
  c.wsd_decay_style = WsdDecayStyle::MinusSqrt;
  EXPECT_NEAR(LrSchedule(c).lr_at(1000), 0.1 + 0.9 * (1 - std::sqrt(0.5)), 1e-12);
}

TEST(LrSchedule, WeightDecayIncrement) {
  LrScheduleConfig c = schedule(DecayStyle::Constant, 0, 100);
  c.start_wd = 0.0;
  c.end_wd = 0.1;
  c.wd_incr_steps = 100;
  c.wd_incr_style = WeightDecayIncrStyle::Linear;
  EXPECT_DOUBLE_EQ(LrSchedule(c).weight_decay_at(50), 0.05);
  c.wd_incr_style = WeightDecayIncrStyle::Cosine;
  EXPECT_NEAR(LrSchedule(c).weight_decay_at(50), 0.05, 1e-12);
  EXPECT_NEAR(LrSchedule(c).weight_decay_at(25), 0.1 * 0.5 * (std::cos(M_PI * 0.75) + 1), 1e-12);
  EXPECT_DOUBLE_EQ(LrSchedule(c).weight_decay_at(500), 0.1);
}

TEST(LrSchedule, StepsInSamples) {
  LrSchedule s(schedule(DecayStyle::Linear, 0, 1000));
  s.step(250);
  s.step(250);
  EXPECT_EQ(s.num_steps(), 500);
  EXPECT_DOUBLE_EQ(s.lr(), 0.55);
}

}  // namespace fp8tron
