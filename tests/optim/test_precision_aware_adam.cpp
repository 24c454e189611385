// The precision-aware optimizer's Adam on the CPU (optim/optimizer_domain.h): bf16 moments are
// stored as bf16 (half the bytes), the update math stays fp32 (the first step from zero moments is
// bitwise the fp32 optimizer's, its moments the fp32 ones rounded to nearest-even), many steps track
// the fp32 optimizer within a stated tolerance, and the flags at fp32 are bitwise the default path.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "tests/optim/precision_aware_run.h"
#include "tests/optim/same_bits.h"

namespace fp8tron {
namespace {

AdamRun make_run(const PrecisionAwareOptimizer& pa, ParamDtype dtype = ParamDtype::Bf16) {
  return make_adam_run({pa, dtype});
}

// The same gradients for every run: step `step`'s, of magnitudes a step sees (a few large, some zeros).
void set_grads(AdamRun& r, int step) {
  torch::manual_seed(100 + step);
  auto g = torch::randn({r.domain().main_grads().numel()}) * 1e-3;
  g = torch::where(torch::rand(g.sizes()) < 0.02, g * 1e3, g);
  g = torch::where(torch::rand(g.sizes()) < 0.02, torch::zeros_like(g), g);
  r.domain().main_grads().copy_(g);
}

void step(AdamRun& r, int i) {
  set_grads(r, i);
  r.optimizer->step(/*lr=*/1e-3, /*weight_decay=*/0.1, /*loss_scale=*/1.0);
}

const PrecisionAwareOptimizer kBf16Moments{true, StateDtype::Bf16, StateDtype::Bf16};
const PrecisionAwareOptimizer kFp32Moments{true, StateDtype::Fp32, StateDtype::Fp32};

TEST(PrecisionAwareAdam, Bf16MomentsAreStoredInBf16) {
  AdamRun r = make_run(kBf16Moments);
  EXPECT_EQ(r.domain().exp_avg().scalar_type(), torch::kBFloat16);
  EXPECT_EQ(r.domain().exp_avg_sq().scalar_type(), torch::kBFloat16);
  EXPECT_EQ(r.domain().exp_avg().nbytes() * 2, r.domain().main_params().nbytes()) << "half the fp32 main weights' bytes";
  AdamRun mixed = make_run({true, StateDtype::Bf16, StateDtype::Fp32});
  EXPECT_EQ(mixed.domain().exp_avg().scalar_type(), torch::kBFloat16);
  EXPECT_EQ(mixed.domain().exp_avg_sq().scalar_type(), torch::kFloat32);
  step(mixed, 1);  // the mixed pair steps too (fp32 second moment updated in place)
  EXPECT_GT(mixed.domain().exp_avg_sq().abs().sum().item<double>(), 0.0);
}

// From zero moments the first step sees the same fp32 inputs: the fp32 math gives the same main
// weights bitwise, and the stored moments are the fp32 optimizer's rounded to nearest-even.
TEST(PrecisionAwareAdam, FirstStepIsTheFp32StepRounded) {
  AdamRun low = make_run(kBf16Moments), ref = make_run(kFp32Moments);
  step(low, 1);
  step(ref, 1);
  EXPECT_TRUE(same_bits(low.domain().main_params(), ref.domain().main_params())) << "main params";
  EXPECT_TRUE(same_bits(low.domain().exp_avg(), ref.domain().exp_avg().to(torch::kBFloat16))) << "exp_avg";
  EXPECT_TRUE(same_bits(low.domain().exp_avg_sq(), ref.domain().exp_avg_sq().to(torch::kBFloat16))) << "exp_avg_sq";
  EXPECT_TRUE(same_bits(low.domain().model_params(), ref.domain().model_params())) << "model params";
}

// Thirty steps: bf16 storage rounds each moment by at most 2^-9 relative per step, which moves the
// update m / (sqrt(v) + eps) by well under 1%. The main weights' distance from the fp32 run stays
// within 1% of how far the fp32 run moved them (measured: 0.28%).
TEST(PrecisionAwareAdam, Bf16MomentsTrackFp32Adam) {
  AdamRun low = make_run(kBf16Moments), ref = make_run(kFp32Moments);
  const auto start = ref.domain().main_params().clone();
  for (int i = 1; i <= 30; ++i) {
    step(low, i);
    step(ref, i);
  }
  const auto moved = (ref.domain().main_params() - start).norm().item<double>();
  const auto apart = (low.domain().main_params() - ref.domain().main_params()).norm().item<double>();
  ASSERT_GT(moved, 0.0);
  EXPECT_LT(apart, 1e-2 * moved) << "apart " << apart << " moved " << moved;
  EXPECT_GT(apart, 0.0) << "bf16 moments must round somewhere in 30 steps";
  // The moments themselves: within bf16's rounding of the fp32 ones, accumulated (2^-7 relative).
  for (const auto& [a, b] : {std::pair{low.domain().exp_avg(), ref.domain().exp_avg()},
                             std::pair{low.domain().exp_avg_sq(), ref.domain().exp_avg_sq()}}) {
    const auto diff = (a.to(torch::kFloat32) - b).norm().item<double>();
    EXPECT_LT(diff, std::ldexp(1.0, -7) * b.norm().item<double>());
  }
}

// --use-precision-aware-optimizer with every dtype fp32 is the default optimizer, bitwise.
TEST(PrecisionAwareAdam, Fp32SettingsAreTheDefaultBitwise) {
  for (ParamDtype dtype : {ParamDtype::Bf16, ParamDtype::Fp32}) {
    SCOPED_TRACE(dtype == ParamDtype::Bf16 ? "bf16 parameters" : "fp32 parameters");
    AdamRun aware = make_run(kFp32Moments, dtype), plain = make_run(PrecisionAwareOptimizer{}, dtype);
    for (int i = 1; i <= 5; ++i) {
      step(aware, i);
      step(plain, i);
    }
    EXPECT_TRUE(same_bits(aware.domain().main_params(), plain.domain().main_params()));
    EXPECT_TRUE(same_bits(aware.domain().exp_avg(), plain.domain().exp_avg()));
    EXPECT_TRUE(same_bits(aware.domain().exp_avg_sq(), plain.domain().exp_avg_sq()));
    EXPECT_TRUE(same_bits(aware.domain().model_params(), plain.domain().model_params()));
  }
}

// A skipped step (a non-finite gradient) leaves bf16 moments and the weights as they were.
TEST(PrecisionAwareAdam, SkippedStepLeavesBf16StatesAlone) {
  AdamRun r = make_run(kBf16Moments);
  step(r, 1);
  const auto p = r.domain().main_params().clone(), m = r.domain().exp_avg().clone(), v = r.domain().exp_avg_sq().clone();
  set_grads(r, 2);
  r.domain().main_grads()[3] = std::numeric_limits<float>::infinity();
  const StepResult result = r.optimizer->step(1e-3, 0.1, 1.0);
  EXPECT_EQ(result.found_inf.item<float>(), 1.0f);
  EXPECT_TRUE(same_bits(r.domain().main_params(), p));
  EXPECT_TRUE(same_bits(r.domain().exp_avg(), m));
  EXPECT_TRUE(same_bits(r.domain().exp_avg_sq(), v));
}

}  // namespace
}  // namespace fp8tron
