// Two training runs that must agree bit for bit: every loss and every final weight (collect them
// with TrainOptions::collect_final_weights).
#pragma once
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "tests/test_helpers.h"
#include "trainer/trainer.h"

namespace fp8tron::testing {

// Four steps of a two-layer tiny model in one CPU process with `flags` added, its final weights
// collected: the runs the FP8 options are compared with.
inline TrainResult train_tiny_on_cpu(const std::vector<std::string>& flags) {
  TrainOptions o;
  o.force_single_process = true;
  o.collect_final_weights = true;
  const auto base = tiny_args({"--num-layers", "2", "--train-iters", "4", "--global-batch-size", "4", "--device", "cpu",
                               "--eval-interval", "1000", "--log-interval", "1000"});
  return train(build(with(base, flags)), o);
}

inline void expect_identical(const TrainResult& a, const TrainResult& b, const std::string& what) {
  ASSERT_EQ(a.losses.size(), b.losses.size()) << what;
  for (size_t i = 0; i < a.losses.size(); ++i) EXPECT_EQ(a.losses[i], b.losses[i]) << what << " iteration " << i + 1;
  ASSERT_EQ(a.final_weights.size(), b.final_weights.size()) << what;
  for (const auto& [name, w] : a.final_weights) EXPECT_TRUE(torch::equal(w, b.final_weights.at(name))) << what << ": " << name;
}

}  // namespace fp8tron::testing
