// The precision-aware optimizer's fp16 main weights (--main-params-dtype fp16, optim/scaled_state.h),
// on the CPU: stored in 2 bytes with one scale per parameter as Transformer Engine's FusedAdam
// stores its master weights (compared bit for bit with TE's arithmetic), each step the fp32 step of
// the weights read back, the model weights written from its fp32 result before the rounding to
// fp16, a skipped step leaves everything alone, and the checkpoints' fp32 copies store back to the
// same bits.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "tests/optim/precision_aware_run.h"
#include "tests/optim/same_bits.h"
#include "tests/optim/scaled_state_reference.h"

namespace fp8tron {
namespace {

// bf16 model weights of different magnitudes per parameter (so each needs its own scale).
AdamRun make_run(StateDtype main, int dp_rank = -1, StateDtype moments = StateDtype::Fp32) {
  return make_adam_run({{true, moments, moments, main}, ParamDtype::Bf16, dp_rank, {0.02, 0.08, 0.32, 1.28}});
}

void set_grads(AdamRun& r, int step) {
  torch::manual_seed(100 + step);
  r.domain().main_grads().copy_(torch::randn({r.domain().main_grads().numel()}) * 1e-2);
}

StepResult step(AdamRun& r, int i) {
  set_grads(r, i);
  return r.optimizer->step(/*lr=*/1e-3, /*weight_decay=*/0.1, /*loss_scale=*/1.0);
}

// TE's stored fp16 values of each parameter's part of `fp32` (this rank's shard), laid out as the
// shard.
torch::Tensor te_stored_shard(const OptimizerDomain& d, const torch::Tensor& fp32) {
  auto out = torch::zeros({d.shard_numel()}, torch::kFloat16);
  const int64_t begin = d.shard_begin(), end = d.shard_begin() + d.shard_numel();
  for (const auto& slot : d.param_slots()) {
    const int64_t lo = std::max(slot.offset, begin), hi = std::min(slot.offset + slot.numel, end);
    if (lo < hi) out.narrow(0, lo - begin, hi - lo).copy_(te_stored(fp32.narrow(0, lo - begin, hi - lo), StateDtype::Fp16));
  }
  return out;
}

TEST(Fp16MainWeights, StoredInTwoBytesFromTheStartingWeights) {
  for (int dp_rank : {-1, 0, 1}) {
    SCOPED_TRACE("data-parallel rank " + std::to_string(dp_rank));
    AdamRun low = make_run(StateDtype::Fp16, dp_rank), ref = make_run(StateDtype::Fp32, dp_rank);
    EXPECT_FALSE(low.domain().main_params().defined());
    ASSERT_EQ(low.domain().main_codes().scalar_type(), torch::kFloat16);
    EXPECT_EQ(low.domain().main_codes().numel(), ref.domain().main_params().numel());
    EXPECT_TRUE(same_bits(low.domain().main_codes(), te_stored_shard(ref.domain(), ref.domain().main_params())));
    EXPECT_TRUE(same_bits(low.domain().model_params(), ref.domain().model_params()));
  }
}

// Each step is the fp32 optimizer's step of the weights read back from fp16 (Adam in fp32, as TE
// unscales its master weights first), the model weights are that fp32 result in bf16, and the
// result is stored as TE stores it: with fp32 and with fp16 moments beside them.
TEST(Fp16MainWeights, EachStepIsTheFp32StepOfTheWeightsReadBack) {
  for (StateDtype moments : {StateDtype::Fp32, StateDtype::Fp16})
  for (int dp_rank : {-1, 0, 1}) {
    SCOPED_TRACE(std::string(moments == StateDtype::Fp32 ? "fp32" : "fp16") + " moments, data-parallel rank " +
                 std::to_string(dp_rank));
    AdamRun low = make_run(StateDtype::Fp16, dp_rank, moments), ref = make_run(StateDtype::Fp32, dp_rank, moments);
    for (int i = 1; i <= 3; ++i) {
      ref.domain().main_params().copy_(low.domain().main_values());
      step(low, i);
      step(ref, i);
      ASSERT_TRUE(same_bits(low.domain().model_params(), ref.domain().model_params())) << "model weights, step " << i;
      ASSERT_TRUE(same_bits(low.domain().main_codes(), te_stored_shard(ref.domain(), ref.domain().main_params())))
          << "stored main weights, step " << i;
      ASSERT_TRUE(same_bits(low.domain().exp_avg(), ref.domain().exp_avg())) << "step " << i;
      ASSERT_TRUE(same_bits(low.domain().exp_avg_sq(), ref.domain().exp_avg_sq())) << "step " << i;
    }
  }
}

// Fifty steps against fp32 main weights: fp16 (11 significant bits, a scale per parameter) stays
// within 5% of how far the fp32 run moved the weights, and does round somewhere. (Where a
// parameter's values reach about 4, fp16's spacing there, about 1e-3, is the size of an Adam step
// at this learning rate: the largest parameter rounds off a good part of each update, 3.4% here.)
TEST(Fp16MainWeights, TrackFp32MainWeights) {
  AdamRun low = make_run(StateDtype::Fp16), ref = make_run(StateDtype::Fp32);
  const auto start = ref.domain().main_params().clone();
  for (int i = 1; i <= 50; ++i) {
    step(low, i);
    step(ref, i);
  }
  const double moved = (ref.domain().main_params() - start).norm().item<double>();
  const double apart = (low.domain().main_values() - ref.domain().main_params()).norm().item<double>();
  ASSERT_GT(moved, 0.0);
  EXPECT_LT(apart, 5e-2 * moved) << "apart " << apart << " moved " << moved;
  EXPECT_GT(apart, 0.0) << "fp16 main weights must round somewhere in 50 steps";
}

// A skipped step (a non-finite gradient) leaves the stored weights, their scales and the model
// weights as they were.
TEST(Fp16MainWeights, SkippedStepLeavesThemAlone) {
  AdamRun r = make_run(StateDtype::Fp16, 1);
  step(r, 1);
  const auto codes = r.domain().main_codes().clone(), model = r.domain().model_params().clone();
  const auto saved = r.domain().main_params_to_save();
  set_grads(r, 2);
  r.domain().main_grads()[r.domain().shard_begin() + 5] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(r.optimizer->step(1e-3, 0.1, 1.0).found_inf.item<float>(), 1.0f);
  EXPECT_TRUE(same_bits(r.domain().main_codes(), codes));
  EXPECT_TRUE(same_bits(r.domain().model_params(), model));
  EXPECT_TRUE(same_bits(r.domain().main_params_to_save(), saved)) << "scales";
  EXPECT_GT(step(r, 3).grad_norm.item<double>(), 0.0);
  EXPECT_FALSE(same_bits(r.domain().main_codes(), codes)) << "the next step updates them";
}

// Checkpoints hold fp32 copies; loading them stores the same bits and scales again after each of
// 20 steps, and the model weights read with them are published as read.
TEST(Fp16MainWeights, CheckpointCopiesStoreBackExactly) {
  AdamRun r = make_run(StateDtype::Fp16);
  for (int i = 1; i <= 20; ++i) {
    step(r, i);
    const auto codes = r.domain().main_codes().clone(), model = r.domain().model_params().clone();
    const auto saved = r.domain().main_params_to_save();
    EXPECT_EQ(saved.scalar_type(), torch::kFloat32);
    EXPECT_EQ(saved.device(), torch::Device(torch::kCPU));
    // As a load does: fill what the domain gives (zeros first, so nothing is kept by accident),
    // then adopt and publish.
    r.domain().main_params_to_load().zero_().copy_(saved);
    r.domain().model_shard_to_load().zero_().copy_(model);
    r.optimizer->adopt_loaded_states();
    r.optimizer->publish_model_params();
    ASSERT_TRUE(same_bits(r.domain().main_codes(), codes)) << "step " << i;
    ASSERT_TRUE(same_bits(r.domain().main_params_to_save(), saved)) << "step " << i;
    ASSERT_TRUE(same_bits(r.domain().model_params(), model)) << "step " << i;
  }
  // Without a model read, publishing casts the weights read back from fp16.
  r.optimizer->publish_model_params();
  EXPECT_TRUE(same_bits(r.domain().model_params(), r.domain().main_values().to(torch::kBFloat16)));
}

}  // namespace
}  // namespace fp8tron
