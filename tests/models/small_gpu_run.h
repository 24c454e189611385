// The small GPU training run the GPU tests compare a feature against (the same run without it):
// four layers, dropout on, deterministic kernels, bf16, final weights collected.
#pragma once
#include <string>
#include <vector>

#include "tests/test_helpers.h"
#include "trainer/trainer.h"

namespace fp8tron::testing {

inline TrainResult train_small_gpu_run(const std::vector<std::string>& extra) {
  auto a = tiny_args({"--num-layers", "4", "--hidden-size", "128", "--num-attention-heads", "4", "--seq-length", "128",
                      "--micro-batch-size", "4", "--global-batch-size", "8", "--vocab-size", "512", "--train-iters", "5",
                      "--attention-dropout", "0.1", "--hidden-dropout", "0.1", "--log-interval", "1000", "--eval-iters",
                      "0", "--device", "cuda", "--bf16", "--deterministic-mode"});
  a.insert(a.end(), extra.begin(), extra.end());
  TrainOptions o;
  o.collect_final_weights = true;
  LaunchEnv env;
  return train(build_config(parse(a), env, /*gpu_available=*/true), o);
}

}  // namespace fp8tron::testing
