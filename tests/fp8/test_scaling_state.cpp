// Delayed scaling: history roll, max vs most_recent, margin, interval, zero/inf/NaN amaxes, the
// single reduction over all amaxes, and the checkpoint round trip.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "core/error.h"
#include "fp8/scaling_state.h"

namespace fp8tron::fp8 {
namespace {

DelayedScaling recipe(Fp8Format format = Fp8Format::kHybrid, int len = 1,
                      AmaxComputeAlgo algo = AmaxComputeAlgo::kMostRecent, int margin = 0, int interval = 1) {
  DelayedScaling r;
  r.format = format;
  r.amax_history_len = len;
  r.amax_compute_algo = algo;
  r.margin = margin;
  r.interval = interval;
  return r;
}

TEST(ScalingState, SlotLayout) {
  DelayedScalingState s(recipe(), 3);
  EXPECT_EQ(s.num_slots(), 15u);
  EXPECT_EQ(s.forward_slots(), 9u);
  EXPECT_EQ(s.slot(0, TensorRole::kInput), 0u);
  EXPECT_EQ(s.slot(0, TensorRole::kWeight), 1u);
  EXPECT_EQ(s.slot(0, TensorRole::kOutput), 2u);
  EXPECT_EQ(s.slot(2, TensorRole::kOutput), 8u);
  EXPECT_EQ(s.slot(0, TensorRole::kGradOutput), 9u);
  EXPECT_EQ(s.slot(1, TensorRole::kGradInput), 12u);
  EXPECT_EQ(s.slot(2, TensorRole::kGradInput), 14u);
  EXPECT_EQ(s.format(TensorRole::kInput), Format::kE4M3);
  EXPECT_EQ(s.format(TensorRole::kGradOutput), Format::kE5M2);
  for (size_t i = 0; i < s.num_slots(); ++i) {
    EXPECT_EQ(s.scale(i), 1.0f);
    EXPECT_EQ(s.scale_inv(i), 1.0f);
  }
}

TEST(ScalingState, MostRecentScaleAndFormats) {
  DelayedScalingState s(recipe(), 1);
  s.record_amax(s.slot(0, TensorRole::kInput), 2.0f);
  s.record_amax(s.slot(0, TensorRole::kInput), 1.0f);  // max-accumulates within a step
  s.record_amax(s.slot(0, TensorRole::kGradOutput), 8.0f);
  EXPECT_TRUE(s.step());
  EXPECT_EQ(s.scale(s.slot(0, TensorRole::kInput)), 224.0f);         // 448 / 2
  EXPECT_EQ(s.scale_inv(s.slot(0, TensorRole::kInput)), 1.0f / 224.0f);
  EXPECT_EQ(s.scale(s.slot(0, TensorRole::kGradOutput)), 7168.0f);   // 57344 / 8 (E5M2 under hybrid)
  EXPECT_EQ(s.scale(s.slot(0, TensorRole::kWeight)), 1.0f);          // saw nothing: unchanged
  EXPECT_EQ(s.current_amax(s.slot(0, TensorRole::kInput)), 0.0f);    // row 0 cleared by the roll
}

TEST(ScalingState, Margin) {
  DelayedScalingState s(recipe(Fp8Format::kE4M3, 1, AmaxComputeAlgo::kMostRecent, /*margin=*/2), 1);
  s.record_amax(0, 7.0f);
  s.record_amax(s.slot(0, TensorRole::kGradOutput), 7.0f);
  s.step();
  EXPECT_EQ(s.scale(0), 448.0f / 4 / 7.0f);
  EXPECT_EQ(s.scale(s.slot(0, TensorRole::kGradOutput)), 448.0f / 4 / 7.0f);  // e4m3 everywhere
}

// TE's window: an update takes the max over the len most recent amaxes, the current one included;
// the history keeps len-1 completed steps.
TEST(ScalingState, MaxOverHistoryWindow) {
  DelayedScalingState s(recipe(Fp8Format::kE4M3, 3, AmaxComputeAlgo::kMax), 1);
  const float amaxes[] = {4.0f, 1.0f, 2.0f, 0.5f, 0.25f};
  const float expected_amax[] = {4.0f, 4.0f, 4.0f, 2.0f, 2.0f};
  for (int step = 0; step < 5; ++step) {
    s.record_amax(0, amaxes[step]);
    s.step();
    EXPECT_EQ(s.scale(0), 448.0f / expected_amax[step]) << "step " << step;
    EXPECT_EQ(s.history(2, 0), amaxes[step]);  // newest completed step
    EXPECT_EQ(s.history(0, 0), 0.0f);
  }
  EXPECT_EQ(s.history(1, 0), 0.5f);
}

TEST(ScalingState, MostRecentIgnoresHistory) {
  DelayedScalingState s(recipe(Fp8Format::kE4M3, 4, AmaxComputeAlgo::kMostRecent), 1);
  s.record_amax(0, 8.0f);
  s.step();
  s.record_amax(0, 1.0f);
  s.step();
  EXPECT_EQ(s.scale(0), 448.0f);
}

TEST(ScalingState, ZeroInfNanAmaxKeepTheScale) {
  for (AmaxComputeAlgo algo : {AmaxComputeAlgo::kMax, AmaxComputeAlgo::kMostRecent}) {
    DelayedScalingState s(recipe(Fp8Format::kE4M3, 2, algo), 1);
    s.record_amax(0, 2.0f);
    s.step();
    ASSERT_EQ(s.scale(0), 224.0f);
    s.step();  // no amax recorded (0): history not rolled, scale kept
    EXPECT_EQ(s.scale(0), 224.0f);
    EXPECT_EQ(s.history(1, 0), 2.0f);
    s.record_amax(0, std::numeric_limits<float>::infinity());
    s.step();  // inf: scale kept
    EXPECT_EQ(s.scale(0), 224.0f) << amax_compute_algo_name(algo);
  }
  // A NaN amax (e.g. from a reduction) is ignored by max and keeps the scale under most_recent.
  for (AmaxComputeAlgo algo : {AmaxComputeAlgo::kMax, AmaxComputeAlgo::kMostRecent}) {
    DelayedScalingState s(recipe(Fp8Format::kE4M3, 2, algo), 1);
    s.record_amax(0, 2.0f);
    s.step();
    s.current_amaxes()[0] = std::numeric_limits<float>::quiet_NaN();
    s.step();
    EXPECT_EQ(s.scale(0), 224.0f) << amax_compute_algo_name(algo);
  }
}

TEST(ScalingState, TinyAmaxGivesFloatMax) {
  DelayedScalingState s(recipe(Fp8Format::kE4M3), 1);
  s.record_amax(0, 1e-40f);  // 448 / 1e-40 overflows fp32
  s.step();
  EXPECT_EQ(s.scale(0), std::numeric_limits<float>::max());
}

TEST(ScalingState, IntervalAccumulatesBetweenUpdates) {
  DelayedScalingState s(recipe(Fp8Format::kE4M3, 1, AmaxComputeAlgo::kMostRecent, 0, /*interval=*/2), 1);
  s.record_amax(0, 8.0f);
  EXPECT_FALSE(s.step());
  EXPECT_EQ(s.scale(0), 1.0f);
  EXPECT_EQ(s.current_amax(0), 8.0f);  // still recording
  s.record_amax(0, 2.0f);
  EXPECT_TRUE(s.step());
  EXPECT_EQ(s.scale(0), 56.0f);  // 448 / max(8, 2)
  EXPECT_FALSE(s.step());
  EXPECT_EQ(s.steps(), 3u);
}

TEST(ScalingState, OneReductionCoversAllAmaxes) {
  DelayedScalingState s(recipe(Fp8Format::kHybrid, 4, AmaxComputeAlgo::kMax, 0, 2), 2);
  const std::vector<float> other_rank(s.num_slots(), 4.0f);
  int calls = 0;
  AmaxReduceFn all_reduce_max = [&](float* amaxes, size_t n) {
    ++calls;
    EXPECT_EQ(amaxes, s.current_amaxes());
    ASSERT_EQ(n, s.num_slots());
    for (size_t i = 0; i < n; ++i) amaxes[i] = std::fmax(amaxes[i], other_rank[i]);
  };
  s.record_amax(0, 16.0f);
  s.step(all_reduce_max);
  EXPECT_EQ(calls, 0);  // not an update step
  s.step(all_reduce_max);
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(s.scale(0), 28.0f);                                    // 448 / 16 (local max wins)
  EXPECT_EQ(s.scale(1), 112.0f);                                   // 448 / 4 (the other rank's)
  EXPECT_EQ(s.scale(s.slot(1, TensorRole::kGradInput)), 14336.0f);  // 57344 / 4

  DelayedScaling local = recipe();
  local.reduce_amax = false;
  DelayedScalingState t(local, 1);
  t.step([&](float*, size_t) { ++calls; });
  EXPECT_EQ(calls, 1);
}

TEST(ScalingState, CpuUpdateFunctionMatchesTheClass) {
  DelayedScalingState s(recipe(Fp8Format::kHybrid, 3, AmaxComputeAlgo::kMax, 1), 2);
  std::vector<float> history(3 * s.num_slots(), 0.0f), scale(s.num_slots(), 1.0f), scale_inv(s.num_slots(), 1.0f);
  for (int step = 0; step < 4; ++step) {
    for (size_t i = 0; i < s.num_slots(); ++i) {
      const float a = 0.5f + static_cast<float>((i * 7 + step * 3) % 11);
      s.record_amax(i, a);
      history[i] = a;
    }
    s.step();
    update_delayed_scaling_cpu({history.data(), scale.data(), scale_inv.data(), 3, s.num_slots()},
                               delayed_update_params(s.recipe(), s.num_gemms()));
  }
  for (size_t i = 0; i < s.num_slots(); ++i) {
    EXPECT_EQ(scale[i], s.scale(i));
    EXPECT_EQ(scale_inv[i], s.scale_inv(i));
  }
}

TEST(ScalingState, CheckpointRoundTrip) {
  DelayedScalingState a(recipe(Fp8Format::kHybrid, 3, AmaxComputeAlgo::kMax), 2);
  for (int step = 0; step < 5; ++step) {
    for (size_t i = 0; i < a.num_slots(); ++i) a.record_amax(i, 1.0f + static_cast<float>(i + step));
    a.step();
  }
  a.record_amax(3, 99.0f);  // mid-step amax survives too
  const std::vector<float> flat = a.serialize();
  DelayedScalingState b(recipe(Fp8Format::kHybrid, 3, AmaxComputeAlgo::kMax), 2);
  b.deserialize(flat);
  EXPECT_EQ(b.steps(), 5u);
  EXPECT_EQ(b.serialize(), flat);
  // Both continue identically.
  a.step();
  b.step();
  for (size_t i = 0; i < a.num_slots(); ++i) EXPECT_EQ(a.scale(i), b.scale(i));

  // Longer history on resume: the completed steps are kept as the newest entries.
  DelayedScalingState longer(recipe(Fp8Format::kHybrid, 5, AmaxComputeAlgo::kMax), 2);
  longer.deserialize(flat);
  const size_t n = a.num_slots();
  for (size_t i = 0; i < n; ++i) {
    EXPECT_EQ(longer.history(4, i), flat[6 + 2 * n + i]);  // saved row 2 (newest) -> row 4
    EXPECT_EQ(longer.history(3, i), flat[6 + 1 * n + i]);  // saved row 1 -> row 3
    EXPECT_EQ(longer.history(2, i), 0.0f);
    EXPECT_EQ(longer.history(1, i), 0.0f);
  }
  EXPECT_EQ(longer.current_amax(3), 99.0f);
  // Shorter: only the newest completed step remains.
  DelayedScalingState shorter(recipe(Fp8Format::kHybrid, 2, AmaxComputeAlgo::kMax), 2);
  shorter.deserialize(flat);
  EXPECT_EQ(shorter.history(1, 0), flat[6 + 2 * n]);

  DelayedScalingState other(recipe(Fp8Format::kHybrid, 3, AmaxComputeAlgo::kMax), 3);
  EXPECT_THROW(other.deserialize(flat), UserError);
  std::vector<float> bad = flat;
  bad[0] = 7.0f;
  EXPECT_THROW(b.deserialize(bad), UserError);
  bad = flat;
  bad.pop_back();
  EXPECT_THROW(b.deserialize(bad), UserError);
}

TEST(ScalingState, CheckpointKeepsLargeStepCounts) {
  DelayedScalingState a(recipe(), 1);
  std::vector<float> flat = a.serialize();
  flat[4] = 12345.0f;
  flat[5] = 3.0f;  // 3 * 2^20 + 12345 steps
  a.deserialize(flat);
  EXPECT_EQ(a.steps(), 3u * (1u << 20) + 12345u);
}

}  // namespace
}  // namespace fp8tron::fp8
