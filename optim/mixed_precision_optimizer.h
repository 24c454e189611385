// Megatron's mixed-precision optimizer over flat buffers (optim/optimizer_domain.h),
// data-parallel aware. A dense model's parameters form one domain, reduced over the data-parallel
// group; a mixture-of-experts model's routed experts form a second one, reduced and (with
// --use-distributed-optimizer) sharded over the expert data-parallel group, as Megatron's
// ChainedOptimizer of a dense and an expert DistributedOptimizer. One global gradient norm over
// both (each parameter counted once) clips both and decides the inf/nan skip for both.
// The step never waits on the GPU: overflow skips and clipping are decided on the device from the
// globally reduced norm, so every rank takes the same decision.
#pragma once
#include <torch/torch.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/config/precision_config.h"
#include "core/config/training_config.h"
#include "parallel/optimizer_instances.h"
#include "parallel/parallel_state.h"
#include "optim/optimizer_domain.h"

namespace fp8tron {

// The unscaled gradients of a step and their global norm, before the update (prepare_step).
struct PreparedStep {
  std::vector<torch::Tensor> grads;  // per domain, as the update reads them
  torch::Tensor grad_norm;           // 0-dim fp32, the global norm before clipping
};

// Weight bytes of sharded domains (summed over them) on this rank: gathered now, gathered at most
// so far, all gathered at once (what an unsharded rank holds), and the shard kept between uses.
// With sharded gradients the same for the units' gradient buffers (grad_shard: the fp32 shard).
struct ShardedWeightBytes {
  int64_t resident = 0, peak = 0, total = 0, shard = 0;
  int64_t grad_resident = 0, grad_peak = 0, grad_total = 0, grad_shard = 0;
};

struct StepResult {
  torch::Tensor grad_norm;  // 0-dim fp32, before clipping (inf/nan when the step was skipped)
  torch::Tensor found_inf;  // 0-dim fp32, 1 when the update was skipped
  torch::Tensor num_zeros;  // 0-dim int64 with count_zeros(): zero gradient elements (global)
};

class MixedPrecisionOptimizer {
 public:
  // `expert_domain`: the model has routed experts (ParamInfo::expert). Every rank of such a model
  // builds the expert domain, empty on pipeline stages without MoE layers, so the norm's
  // collectives line up. `byte_params`: published as bytes later (enable_byte_publish,
  // --fp8-param-gather); the domain holding each (dense or expert) lays them out first. `instances`:
  // the domains' data-parallel groups split into distributed-optimizer instances
  // (--num-distributed-optimizer-instances); default one instance each.
  MixedPrecisionOptimizer(const std::vector<NamedParam>& params, const OptimizerConfig& optimizer,
                          const PrecisionConfig& precision, const ParallelState& parallel, bool distributed,
                          bool expert_domain = false, const std::vector<torch::Tensor>& byte_params = {},
                          const DataParallelInstances& instances = {}, bool shard_grads = false);
  // Call before enable_param_gather_overlap: `publish(domain)` gives the functions of each domain
  // holding some of the constructor's byte_params (its `params` are those of the domain).
  void enable_byte_publish(const std::function<BytePublish(const OptimizerDomain&)>& publish);
  // Whether some model parameters hold other values than their fp32 main weights (published as bytes).
  bool byte_published() const;

  void zero_grad();
  // Gradients of `params` are overwritten by the first backward of every step (FP8 wgrad GEMMs
  // writing into the main gradient), so zero_grad() leaves them alone.
  void skip_zeroing(const std::vector<torch::Tensor>& params);
  // After the last micro-batch's backward: sums partial tensor-parallel gradients, the tied
  // embedding's two copies, and averages over data-parallel ranks (experts: over their group).
  void finalize_grads();
  // --overlap-grad-reduce: reduce gradient buckets during backward, as they complete (with the
  // distributed optimizer, onto the ranks owning each bucket's elements). Call arm_grad_overlap()
  // before the backward pass of the last micro-batch.
  void enable_grad_overlap(int64_t bucket_numel);
  void arm_grad_overlap();
  // --delay-wgrad-compute with the overlap: the gradients of `params` are completed by held work
  // after autograd passed them (core/deferred_work.h), which reports each with grad_done(its
  // TensorImpl) instead of its accumulator's hook. Call after enable_grad_overlap.
  void complete_grads_later(const std::vector<torch::Tensor>& params);
  void grad_done(const void* param);
  // With sharded gradients: `param`'s gradient buffer allocated now, ahead of a write from outside
  // its unit's backward pass (parallel/sharded_grads.h); otherwise a no-op.
  void allocate_grad_of(const torch::Tensor& param);
  // --overlap-param-gather (distributed optimizer): the step publishes the new weights by issuing
  // the all-gathers bucket by bucket without waiting; the forward pass calls
  // wait_for_params(module) before a module uses its weights, and whatever else reads the model
  // weights calls finish_param_gather() first. Without it both are no-ops.
  // `with_optimizer_step` (--overlap-param-gather-with-optimizer-step): each domain steps the
  // first model chunk's parameters first and issues their all-gather before stepping the rest.
  void enable_param_gather_overlap(int64_t bucket_numel, bool with_optimizer_step = false);
  void wait_for_params(const torch::nn::Module& module);
  void finish_param_gather();
  bool param_gather_overlapped() const;
  // Parameter all-gather buckets issued while the step still had parameters to update, so far.
  int64_t param_gathers_during_step() const;
  // Megatron-FSDP's optim_grads_params (OptimizerDomain::shard_model_params): every domain keeps
  // its weights sharded, gathered around their use. `units`: the model's parameters by the module
  // that uses them, in forward order. The forward pass calls wait_for_params(module) before a
  // module runs and release_params(module, its outputs) after; readers of the whole model call
  // gather_all_params() first and release_all_params() when done (a pipeline's next forward may
  // run one model chunk long before the others, which would otherwise stay gathered).
  void shard_model_params(const std::vector<std::vector<torch::Tensor>>& units, GatherPolicy policy);
  void release_params(const torch::nn::Module& module, const std::vector<torch::Tensor>& outputs);
  void gather_all_params();
  void release_all_params();
  bool params_sharded() const;
  ShardedWeightBytes sharded_weight_bytes() const;
  // Megatron-FSDP's optim strategy (OptimizerDomain::all_reduce_sharded_grads). Before enable_grad_overlap.
  void all_reduce_sharded_grads();
  // Unscales by 1/loss_scale, checks for inf/nan, clips, updates, publishes the new weights.
  // `group_lrs`: the learning rates of the groups with their own (optim/param_groups.h: the
  // embedding and output layer under --decoupled-lr, MuP's width-scaled group); `lr` is the rest's.
  StepResult step(double lr, double weight_decay, double loss_scale, const GroupLrs& group_lrs = {});
  // The same with the gradients divided by a device scalar (the loss scale times, with
  // --calculate-per-token-loss, the global token count), so the step never waits on the device.
  StepResult step(double lr, double weight_decay, const torch::Tensor& grad_divisor, const GroupLrs& group_lrs = {});
  // step() in two halves, so that the norm can be judged before the update: prepare_step divides the
  // gradients (in place) and takes their global norm; apply_step clips and updates, skipping the
  // update on every rank when the norm is not finite or `skip` (a 0-dim device flag, 1: skip) is
  // set. Neither waits on the GPU.
  PreparedStep prepare_step(const torch::Tensor& grad_divisor);
  StepResult apply_step(PreparedStep& prepared, double lr, double weight_decay, const GroupLrs& group_lrs,
                        const torch::Tensor& skip = torch::Tensor());
  // --log-num-zeros-in-grad: every step also counts the zero gradient elements (Megatron's
  // count_zeros_fp32: each parameter once, after clipping, over every rank holding a part).
  void count_zeros(bool on) { count_zeros_ = on; }
  // Muon: the fused QKV weight's rows per query group (Q heads, K, V), for --muon-no-split-qkv's
  // opposite (set before the first step by the trainer from the model config).
  void set_qkv_rows(const std::vector<int64_t>& rows) {
    for (auto& d : domains_) d->set_qkv_rows(rows);
  }

  torch::Tensor params_norm();  // of the fp32 main weights (global)
  // After a step whose gradient norm was not finite: the first of this rank's parameters (dense or
  // expert), in the model's order, whose gradient (as the step saw it) holds NaN or inf, as (its
  // position in the model's parameter list, its name); nullopt when none does on this rank. One
  // check per parameter: for the error report only.
  std::optional<std::pair<int64_t, std::string>> first_nonfinite_grad() const;
  int64_t num_parameters() const;
  // Adam's step count (every segment a rank updates holds the same one).
  double step_count() const;
  void set_step_count(double steps);
  // After a checkpoint load wrote every state: states scaled per parameter take the values read
  // (OptimizerDomain::main_params_to_load, moments_to_load).
  void adopt_loaded_states();
  // Model parameters := main weights, as after an optimizer step. Waits.
  void publish_model_params();

  // The dense domain first, then the experts' (when the model has any).
  const std::vector<std::unique_ptr<OptimizerDomain>>& domains() const { return domains_; }
  const torch::Tensor& main_grads() const { return domains_.front()->main_grads(); }  // the dense domain's

 private:
  std::vector<std::unique_ptr<OptimizerDomain>> domains_;
  double clip_grad_;
  bool count_zeros_ = false;
  std::map<std::string, int64_t> model_order_;  // parameter name -> position in the model's list
};

// The groups of the dense and the expert domain in `parallel`, their distributed optimizer split
// into `instances` (empty: one instance).
DomainGroups dense_domain_groups(const ParallelState& parallel, const OptimizerInstanceGroups& instances = {});
DomainGroups expert_domain_groups(const ParallelState& parallel, const OptimizerInstanceGroups& instances = {});

}  // namespace fp8tron
