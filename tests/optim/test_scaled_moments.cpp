// The precision-aware optimizer's fp16 and fp8 Adam moments (optim/scaled_state.h), on the CPU:
// stored in 2 and 1 bytes, one scale per parameter chosen as Transformer Engine's FusedAdam
// chooses it (the stored values compared bit for bit with TE's arithmetic written out below), a
// skipped step leaves them alone, and the fp32 copies checkpoints hold store back to the same bits.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "tests/optim/precision_aware_run.h"
#include "tests/optim/scaled_state_reference.h"
#include "tests/optim/same_bits.h"

namespace fp8tron {
namespace {

// `dp_rank` >= 0: that rank of a data-parallel group of two (its shard cuts parameters).
AdamRun make_run(StateDtype exp_avg, StateDtype exp_avg_sq, int dp_rank = -1) {
  return make_adam_run({{true, exp_avg, exp_avg_sq}, ParamDtype::Bf16, dp_rank});
}

// Step `step`'s gradients: parameters of different magnitudes (so each needs its own scale).
void set_grads(AdamRun& r, int step) {
  torch::manual_seed(100 + step);
  auto g = torch::randn({r.domain().main_grads().numel()}) * 1e-3;
  g = torch::where(torch::rand(g.sizes()) < 0.02, torch::zeros_like(g), g);
  int k = 0;
  for (const auto& slot : r.domain().param_slots()) g.narrow(0, slot.offset, slot.numel).mul_(std::pow(10.0, k++));
  r.domain().main_grads().copy_(g);
}

void step(AdamRun& r, int i) {
  set_grads(r, i);
  r.optimizer->step(/*lr=*/1e-3, /*weight_decay=*/0.1, /*loss_scale=*/1.0);
}

TEST(ScaledMoments, StoredInTwoAndOneBytes) {
  AdamRun r = make_run(StateDtype::Fp8, StateDtype::Fp16);
  EXPECT_EQ(r.domain().exp_avg().scalar_type(), torch::kFloat8_e4m3fn);
  EXPECT_EQ(r.domain().exp_avg_sq().scalar_type(), torch::kFloat16);
  EXPECT_EQ(r.domain().exp_avg().nbytes() * 4, r.domain().main_params().nbytes());
  EXPECT_EQ(r.domain().exp_avg_sq().nbytes() * 2, r.domain().main_params().nbytes());
}

// From zero moments the first step's fp32 math is the fp32 optimizer's: the same main weights bit
// for bit, and each parameter's moments stored as TE stores the fp32 ones, its largest value on
// the top of the range (one scale per parameter: the gradients' magnitudes differ by 10x each).
// With the distributed optimizer a parameter cut by the shard boundary has a scale per rank.
TEST(ScaledMoments, FirstStepStoresTheFp32MomentsAsTransformerEngine) {
  for (int dp_rank : {-1, 0, 1})
  for (StateDtype dtype : {StateDtype::Fp16, StateDtype::Fp8}) {
    SCOPED_TRACE(std::string(dtype == StateDtype::Fp16 ? "fp16" : "fp8") + ", data-parallel rank " + std::to_string(dp_rank));
    AdamRun low = make_run(dtype, dtype, dp_rank), ref = make_run(StateDtype::Fp32, StateDtype::Fp32, dp_rank);
    step(low, 1);
    step(ref, 1);
    EXPECT_TRUE(same_bits(low.domain().main_params(), ref.domain().main_params())) << "main params";
    EXPECT_TRUE(same_bits(low.domain().model_params(), ref.domain().model_params())) << "model params";
    const double top = dtype == StateDtype::Fp16 ? 32752.0 : 448.0;
    for (const auto& [stored, fp32] : {std::pair{low.domain().exp_avg(), ref.domain().exp_avg()},
                                       std::pair{low.domain().exp_avg_sq(), ref.domain().exp_avg_sq()}}) {
      const auto mine = per_param(low.domain(), stored), theirs = per_param(ref.domain(), fp32);
      ASSERT_EQ(mine.size(), theirs.size());
      for (size_t i = 0; i < mine.size(); ++i) {
        EXPECT_TRUE(same_bits(mine[i].second, te_stored(theirs[i].second, dtype))) << mine[i].first;
        EXPECT_EQ(mine[i].second.to(torch::kFloat32).abs().max().item<double>(), top) << mine[i].first;
      }
    }
  }
}

// Thirty steps against fp32 Adam. fp16 moments (11 significant bits, scaled): within 1% of how
// far fp32 Adam moved the weights, as bf16 moments are. fp8 first moments (4 significant bits)
// beside an fp16 second moment: within 10%.
TEST(ScaledMoments, TrackFp32Adam) {
  struct Case {
    StateDtype m, v;
    double tolerance;
  };
  for (const Case& c : {Case{StateDtype::Fp16, StateDtype::Fp16, 1e-2}, Case{StateDtype::Fp8, StateDtype::Fp16, 1e-1}}) {
    AdamRun low = make_run(c.m, c.v), ref = make_run(StateDtype::Fp32, StateDtype::Fp32);
    const auto start = ref.domain().main_params().clone();
    for (int i = 1; i <= 30; ++i) {
      step(low, i);
      step(ref, i);
    }
    const double moved = (ref.domain().main_params() - start).norm().item<double>();
    const double apart = (low.domain().main_params() - ref.domain().main_params()).norm().item<double>();
    ASSERT_GT(moved, 0.0);
    EXPECT_LT(apart, c.tolerance * moved) << "apart " << apart << " moved " << moved;
    EXPECT_GT(apart, 0.0) << "low-precision moments must round somewhere in 30 steps";
  }
}

// A skipped step (a non-finite gradient) leaves the stored moments and their scales as they were.
TEST(ScaledMoments, SkippedStepLeavesThemAlone) {
  AdamRun r = make_run(StateDtype::Fp8, StateDtype::Fp16);
  step(r, 1);
  const auto m = r.domain().exp_avg().clone(), v = r.domain().exp_avg_sq().clone();
  const auto [m32, v32] = r.domain().moments_to_save();
  set_grads(r, 2);
  r.domain().main_grads()[3] = std::numeric_limits<float>::infinity();
  const StepResult result = r.optimizer->step(1e-3, 0.1, 1.0);
  EXPECT_EQ(result.found_inf.item<float>(), 1.0f);
  EXPECT_TRUE(same_bits(r.domain().exp_avg(), m));
  EXPECT_TRUE(same_bits(r.domain().exp_avg_sq(), v));
  const auto [m32_after, v32_after] = r.domain().moments_to_save();
  EXPECT_TRUE(same_bits(m32_after, m32)) << "scales";
  EXPECT_TRUE(same_bits(v32_after, v32)) << "scales";
}

// Checkpoints hold fp32 copies; loading them stores the same bits and scales again, after every
// one of 20 steps (values read back as stored would choose another FP8 scale about once in ten).
TEST(ScaledMoments, CheckpointCopiesStoreBackExactly) {
  for (StateDtype dtype : {StateDtype::Fp16, StateDtype::Fp8}) {
    SCOPED_TRACE(dtype == StateDtype::Fp16 ? "fp16" : "fp8");
    AdamRun r = make_run(dtype, dtype);
    for (int i = 1; i <= 20; ++i) {
      step(r, i);
      const auto m = r.domain().exp_avg().clone(), v = r.domain().exp_avg_sq().clone();
      const auto [m32, v32] = r.domain().moments_to_save();
      EXPECT_EQ(m32.scalar_type(), torch::kFloat32);
      EXPECT_EQ(m32.device(), torch::Device(torch::kCPU));
      // As a load does: fill what moments_to_load() gives (here: zeros first, so nothing is kept
      // by accident), then adopt.
      auto [m_in, v_in] = r.domain().moments_to_load();
      m_in.zero_().copy_(m32);
      v_in.zero_().copy_(v32);
      r.optimizer->adopt_loaded_states();
      ASSERT_TRUE(same_bits(r.domain().exp_avg(), m)) << "step " << i;
      ASSERT_TRUE(same_bits(r.domain().exp_avg_sq(), v)) << "step " << i;
      const auto [m32_again, v32_again] = r.domain().moments_to_save();
      ASSERT_TRUE(same_bits(m32_again, m32)) << "step " << i;
      ASSERT_TRUE(same_bits(v32_again, v32)) << "step " << i;
    }
  }
}

// Groups join adjacent pieces up to a size; a group is stored with the bits and scales each of its
// pieces gets alone, and a skip keeps a whole group.
TEST(ScaledMoments, GroupsStoreAsSinglePieces) {
  const std::vector<std::pair<int64_t, int64_t>> pieces = {{0, 3}, {3, 5}, {10, 2}, {12, 4}, {16, 20}, {36, 1}};
  const auto cpu = torch::TensorOptions();
  for (StateDtype dtype : {StateDtype::Fp16, StateDtype::Fp8}) {
    ScaledState grouped(dtype, 40, pieces, cpu), single(dtype, 40, pieces, cpu);
    const auto groups = grouped.groups(0, pieces.size(), 8);
    const std::vector<ScaledState::Group> expected = {{0, 2}, {2, 4}, {4, 5}, {5, 6}};
    EXPECT_EQ(groups, expected);
    torch::manual_seed(7);
    auto values = torch::randn({40}) * torch::pow(10.0, torch::randint(-6, 3, {40}).to(torch::kFloat32));
    values.narrow(0, 10, 2).zero_();  // an all-zero piece
    for (const auto& g : groups) grouped.store(g, values.narrow(0, grouped.begin(g), grouped.numel(g)));
    for (size_t i = 0; i < pieces.size(); ++i)
      single.store({i, i + 1}, values.narrow(0, pieces[i].first, pieces[i].second));
    EXPECT_TRUE(same_bits(grouped.stored(), single.stored()));
    for (const auto& g : groups) EXPECT_TRUE(same_bits(grouped.unscaled(g), single.unscaled(g)));
    EXPECT_TRUE(same_bits(grouped.unscaled_copy(torch::kCPU), single.unscaled_copy(torch::kCPU)));
    const auto before = grouped.stored().clone();
    const auto other = values.narrow(0, 0, 8).flip(0);
    grouped.store(groups[0], other, torch::ones({}));
    EXPECT_TRUE(same_bits(grouped.stored(), before)) << "skipped";
    grouped.store(groups[0], other, torch::zeros({}));
    EXPECT_FALSE(same_bits(grouped.stored(), before)) << "not skipped";
  }
}

}  // namespace
}  // namespace fp8tron
