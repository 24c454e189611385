// Megatron's mixed-precision optimizer over flat buffers, data-parallel aware:
//  - model parameters (bf16/fp16/fp32) become views into one contiguous buffer;
//  - their gradients are views into one contiguous "main grad" buffer (fp32, or the parameter
//    dtype for fp16 without --accumulate-allreduce-grads-in-fp32), so autograd accumulates
//    micro-batches straight into it and data-parallel reductions work on it in place;
//  - parameters are ordered into segments by (weight decay, how they count in the gradient
//    norm), so every optimizer kernel and norm runs once per segment over one tensor;
//  - with --use-distributed-optimizer the fp32 main weights and Adam states exist only for this
//    data-parallel rank's shard of the buffer: gradients are reduce-scattered into it and the
//    updated parameters all-gathered back.
// The step never waits on the GPU: overflow skips and clipping are decided on the device from the
// globally reduced norm, so every rank takes the same decision.
#pragma once
#include <torch/torch.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "parallel/sharding.h"
#include "parallel/grad_buckets.h"
#include "parallel/param_gather.h"
#include "parallel/parallel_state.h"
#include "core/config/precision_config.h"
#include "core/config/training_config.h"
#include "trainer/optim/muon.h"

namespace fp8tron {

struct StepResult {
  torch::Tensor grad_norm;  // 0-dim fp32, before clipping (inf/nan when the step was skipped)
  torch::Tensor found_inf;  // 0-dim fp32, 1 when the update was skipped
  torch::Tensor num_zeros;  // 0-dim int64 with count_zeros(): zero gradient elements (global)
};

struct NamedParam {
  std::string name;
  torch::Tensor tensor;
  ParamInfo info;
};

class MixedPrecisionOptimizer {
 public:
  MixedPrecisionOptimizer(const std::vector<NamedParam>& params, const OptimizerConfig& optimizer,
                          const PrecisionConfig& precision, const ParallelState& parallel, bool distributed);

  void zero_grad();
  // Gradients of `params` are overwritten by the first backward of every step (FP8 wgrad GEMMs
  // writing into the main gradient), so zero_grad() leaves them alone.
  void skip_zeroing(const std::vector<torch::Tensor>& params);
  // After the last micro-batch's backward: sums partial tensor-parallel gradients, the tied
  // embedding's two copies, and averages over data-parallel ranks.
  void finalize_grads();
  // --overlap-grad-reduce: reduce gradient buckets during backward, as they complete (with the
  // distributed optimizer, onto the ranks owning each bucket's elements). Call arm_grad_overlap()
  // before the backward pass of the last micro-batch.
  void enable_grad_overlap(int64_t bucket_numel);
  void arm_grad_overlap();
  // --overlap-param-gather (distributed optimizer): the step publishes the new weights by issuing
  // the data-parallel all-gathers bucket by bucket without waiting; the forward pass calls
  // wait_for_params(module) before a module uses its weights, and whatever else reads the model
  // weights calls finish_param_gather() first. Without it both are no-ops.
  void enable_param_gather_overlap(int64_t bucket_numel);
  void wait_for_params(const torch::nn::Module& module);
  void finish_param_gather();
  bool param_gather_overlapped() const { return param_gather_ != nullptr; }
  // Unscales by 1/loss_scale, checks for inf/nan, clips, updates, publishes the new weights.
  // `decoupled_lr`: the learning rate of the embedding and output layer (--decoupled-lr).
  StepResult step(double lr, double weight_decay, double loss_scale, std::optional<double> decoupled_lr = std::nullopt);
  // The same with the gradients divided by a device scalar (the loss scale times, with
  // --calculate-per-token-loss, the global token count), so the step never waits on the device.
  StepResult step(double lr, double weight_decay, const torch::Tensor& grad_divisor,
                  std::optional<double> decoupled_lr = std::nullopt);
  // --log-num-zeros-in-grad: every step also counts the zero gradient elements (Megatron's
  // count_zeros_fp32: each parameter once, after clipping, over every rank holding a part).
  void count_zeros(bool on) { count_zeros_ = on; }
  // Muon: the fused QKV weight's rows per query group (Q heads, K, V), for --muon-no-split-qkv's
  // opposite (set before the first step by the trainer from the model config).
  void set_qkv_rows(std::vector<int64_t> rows) {
    qkv_rows_ = rows;
    for (auto& slot : muon_slots_) if (slot.param.qkv) slot.param.qkv_rows = rows;
  }

  torch::Tensor params_norm();  // of the fp32 main weights (global)
  int64_t num_parameters() const { return numel_; }
  const torch::Tensor& main_grads() const { return main_grads_; }

  // ---- for checkpoints: where each parameter and its optimizer state live ----
  struct ParamSlot {
    std::string name;
    int64_t offset = 0, numel = 0;  // in the flat buffers
    std::vector<int64_t> shape;     // this rank's shard
    ParamInfo info;
  };
  const std::vector<ParamSlot>& param_slots() const { return slots_; }  // in buffer order
  bool distributed() const { return distributed_; }
  // The fp32 main weights and Adam states (exp_avg is SGD's momentum) hold the elements
  // [shard_begin, shard_begin + shard_numel) of the flat buffer: all of it, or with
  // --use-distributed-optimizer this data-parallel rank's shard (the padding included).
  int64_t shard_begin() const { return shard_begin_; }
  int64_t shard_numel() const { return shard_numel_; }
  // Flat views (the buffers themselves: writing into them changes the state).
  torch::Tensor model_params() const { return model_params_.narrow(0, 0, numel_); }
  torch::Tensor main_params() const { return main_params_; }
  torch::Tensor exp_avg() const { return exp_avg_; }
  torch::Tensor exp_avg_sq() const { return exp_avg_sq_; }  // undefined for SGD
  // Adam's step count (every segment this rank updates holds the same one).
  double step_count() const;
  void set_step_count(double steps);
  // Model parameters := main weights (cast to the parameter dtype; all-gathered over
  // data-parallel ranks with the distributed optimizer), as after an optimizer step. Waits.
  void publish_model_params();

 private:
  struct Segment {
    int64_t offset, numel;
    bool decay;
    double norm_weight;  // 1, 1/tp for tensor-parallel duplicates, 0 for the tied-embedding copy
    int lr_group = 0;    // 1: the decoupled learning rate (embedding and output layer)
    bool muon = false;   // updated by Muon (2-D hidden weights with --optimizer muon)
  };
  struct MuonSlot {
    int64_t offset;               // in the flat buffers
    std::vector<int64_t> shape;   // this rank's shard
    MuonParam param;
  };
  void muon_step(const Segment& s, const torch::Tensor& grads, double lr, double wd, const torch::Tensor& found_inf);
  torch::Tensor zeros_in(const torch::Tensor& grads);  // laid out from shard_begin_
  // Squared norm of `buffer` (laid out like the flat buffer from `base`) weighted per segment,
  // summed over the groups that hold different parts of the model.
  torch::Tensor global_norm_squared(const torch::Tensor& buffer, int64_t base);
  void all_reduce_model_groups(torch::Tensor& value);
  // The sums over other groups that finalize_grads() adds to the data-parallel one.
  void sum_tensor_parallel_partials(bool own_shard_only);
  void sum_embedding_copies();

  OptimizerConfig config_;
  const ParallelState& parallel_;
  bool distributed_;
  std::unique_ptr<GradBuckets> buckets_;
  std::unique_ptr<ParamGather> param_gather_;
  std::vector<BufferParam> buffer_order_;  // parameters in flat-buffer order
  bool separate_main_weights_;
  int64_t numel_ = 0, padded_numel_ = 0, shard_begin_ = 0, shard_numel_ = 0;
  std::vector<Segment> segments_;
  std::vector<std::pair<int64_t, int64_t>> tp_partial_ranges_;  // (offset, numel)
  std::vector<std::pair<int64_t, int64_t>> embedding_ranges_;
  torch::Tensor model_params_;  // flat, parameter dtype (padded)
  torch::Tensor main_params_;   // fp32: the whole buffer, or this rank's shard
  torch::Tensor main_grads_;    // flat (padded), fp32 or parameter dtype
  torch::Tensor grad_shard_;    // distributed optimizer: this rank's reduced gradients (fp32)
  torch::Tensor exp_avg_, exp_avg_sq_;
  std::vector<torch::Tensor> step_counts_;  // one per segment
  std::vector<ParamSlot> slots_;
  std::vector<MuonSlot> muon_slots_;
  std::vector<int64_t> qkv_rows_;
  bool count_zeros_ = false;
  std::vector<std::pair<int64_t, int64_t>> zeroed_ranges_;  // (offset, numel); empty: all of main_grads_
};

}  // namespace fp8tron
