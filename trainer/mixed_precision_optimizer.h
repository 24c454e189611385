// Megatron's mixed-precision optimizer over flat buffers:
//  - model parameters (bf16/fp16/fp32) become views into one contiguous buffer;
//  - their gradients are views into one contiguous fp32 "main grad" buffer (fp16 without
//    --accumulate-allreduce-grads-in-fp32: the parameter dtype), so autograd accumulates
//    micro-batches straight into it, and data-parallel buckets will later reduce it in place;
//  - fp32 main weights and Adam states live in flat buffers too, ordered weight-decay group
//    first, so each optimizer kernel runs once per group over one tensor.
// The step never waits on the GPU: overflow skips and clipping are decided on the device.
#pragma once
#include <torch/torch.h>

#include <string>
#include <utility>
#include <vector>

#include "trainer/config.h"

namespace fp8tron {

struct StepResult {
  torch::Tensor grad_norm;  // 0-dim fp32, before clipping (inf/nan when the step was skipped)
  torch::Tensor found_inf;  // 0-dim fp32, 1 when the update was skipped
};

class MixedPrecisionOptimizer {
 public:
  MixedPrecisionOptimizer(const std::vector<std::pair<std::string, torch::Tensor>>& named_params,
                          const OptimizerConfig& optimizer, const PrecisionConfig& precision);

  void zero_grad();
  // Unscales by 1/loss_scale, checks for inf/nan, clips, updates, copies main weights back.
  StepResult step(double lr, double weight_decay, double loss_scale);

  torch::Tensor params_norm() const;  // of the fp32 main weights
  int64_t num_parameters() const { return numel_; }
  const torch::Tensor& main_grads() const { return main_grads_; }

 private:
  OptimizerConfig config_;
  bool separate_main_weights_;
  int64_t numel_ = 0, decay_numel_ = 0;
  torch::Tensor model_params_;  // flat, parameter dtype
  torch::Tensor main_params_;   // flat fp32 (== model_params_ in fp32 training)
  torch::Tensor main_grads_;    // flat, fp32 or parameter dtype
  torch::Tensor exp_avg_, exp_avg_sq_;
  torch::Tensor step_count_[2];
  torch::Tensor grads_fp32_;    // fp32 view/copy of main_grads_ used by the update
};

}  // namespace fp8tron
