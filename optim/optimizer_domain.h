// One domain of the mixed-precision optimizer: a set of parameters over flat buffers, reduced,
// sharded and normed over its own groups (Megatron's DistributedOptimizer inside a
// ChainedOptimizer). A dense model has one domain (data-parallel); a mixture-of-experts model
// adds the routed experts' domain (expert data-parallel, Megatron's expert_parallel_buffers):
//  - model parameters (bf16/fp16/fp32) become views into one contiguous buffer;
//  - their gradients are views into one contiguous "main grad" buffer (fp32, or the parameter
//    dtype for fp16 without --accumulate-allreduce-grads-in-fp32), so autograd accumulates
//    micro-batches straight into it and the reductions work on it in place;
//  - parameters are ordered into segments by (Muon or not, weight decay, learning-rate group and
//    Adam epsilon (optim/param_groups.h), how they count in the gradient norm), so every
//    optimizer kernel and norm runs once per segment over one tensor (Muon: once per matrix);
//  - with --use-distributed-optimizer the fp32 main weights and Adam states exist only for this
//    rank's shard of the buffer over the domain's data-parallel group (over its optimizer
//    instance with --num-distributed-optimizer-instances, see DomainGroups): gradients are
//    reduce-scattered into it and the updated parameters all-gathered back. Muon's matrices are
//    never cut by a shard boundary (Megatron's layer-wise distributed optimizer: Newton-Schulz
//    needs the whole matrix), so the buffer may hold padding between them
//    (optim/buffer_layout.h).
#pragma once
#include <torch/torch.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "core/config/precision_config.h"
#include "core/config/training_config.h"
#include "parallel/grad_buckets.h"
#include "parallel/param_gather.h"
#include "parallel/sharded_grads.h"
#include "parallel/sharded_weights.h"
#include "parallel/sharding.h"
#include "optim/muon.h"
#include "optim/param_groups.h"
#include "optim/scaled_state.h"

namespace fp8tron {

struct NamedParam {
  std::string name;
  torch::Tensor tensor;
  ParamInfo info;
  int chunk = 0;  // the model chunk (virtual pipeline stage) of this pipeline rank holding it
};

// --fp8-param-gather: parameters published in one byte per element. The step encodes this rank's
// shard of them from the fp32 main weights (`encode(main, codes, offset)`: main and codes cover the
// buffer elements [offset, offset + main.numel()); called on every rank, possibly with an empty
// range, as it may reduce over the data-parallel group), the all-gather moves the bytes, and
// `decode(codes, offset, numel)` runs once a gathered range [offset, offset + numel) (whole
// parameters) has arrived; it gives the model parameters their new values. The optimizer knows
// nothing of FP8 (trainer/fp8_param_gather.h supplies the functions).
struct BytePublish {
  std::vector<torch::Tensor> params;  // whole parameters, laid out first in the flat buffer
  std::function<void(const torch::Tensor& main, torch::Tensor& codes, int64_t offset)> encode;
  std::function<void(const torch::Tensor& codes, int64_t offset, int64_t numel)> decode;
};

// The groups a domain's parameters are reduced, sharded and normed over.
struct DomainGroups {
  std::string name;                  // "dense" | "expert"
  // Gradient sum and distributed-optimizer shards. The backward seeds carry 1 / (micro-batches x
  // data-parallel ranks), so summing over this group gives the data-parallel mean for the dense
  // weights and, for the experts (summed over their expert data-parallel replicas, each already
  // holding every expert-parallel rank's tokens), Megatron's expert gradient.
  std::shared_ptr<Communicator> dp;
  // With --use-distributed-optimizer the state is sharded over `shard` and `dp`'s sum is taken as
  // a reduce-scatter over `shard` followed by an all-reduce over `instances`: Megatron's partial
  // distributed optimizer (parallel/optimizer_instances.h), where `shard` is this rank's instance
  // and `instances` the ranks holding the same shard in the other instances. Null: `dp` itself
  // and no other instance.
  std::shared_ptr<Communicator> shard, instances;
  std::shared_ptr<Communicator> tp;  // partitions the weights; sums partial (reduce_grad_over_tp) grads
  // Groups holding other parts of the model, summed over for the gradient norm (after tp).
  std::vector<std::shared_ptr<Communicator>> model_parallel;
  // The tied embedding's first and last stages (dense domain; null elsewhere).
  std::shared_ptr<Communicator> embedding;
};

class OptimizerDomain {
 public:
  // `params` may be empty (an expert domain on a pipeline stage without MoE layers still joins
  // the norm's collectives); `device` is where its buffers live. `byte_params`: parameters to be
  // published as bytes later (enable_byte_publish); they are laid out first in the flat buffer.
  // `shard_grads` (Megatron-FSDP's optim_grads_params, with the distributed optimizer over more
  // than one rank): no whole gradient buffer is allocated; shard_model_params() gives each unit
  // its own (parallel/sharded_grads.h) and must follow.
  OptimizerDomain(const std::vector<NamedParam>& params, const OptimizerConfig& optimizer, const PrecisionConfig& precision,
                  DomainGroups groups, bool distributed, torch::Device device,
                  const std::vector<torch::Tensor>& byte_params = {}, bool shard_grads = false);
  // Call before enable_param_gather_overlap; `publish.params` must be the constructor's byte_params.
  void enable_byte_publish(BytePublish publish);
  // Whether some model parameters hold other values than their fp32 main weights (published as bytes).
  bool byte_published() const { return codes_.defined(); }
  // The elements of the constructor's byte_params (laid out first in the flat buffer).
  int64_t byte_numel() const { return byte_numel_; }

  const DomainGroups& groups() const { return groups_; }
  void zero_grad();
  // Of `params`, those in this domain: their gradients are not zeroed by zero_grad().
  void skip_zeroing(const std::vector<torch::Tensor>& params);
  bool holds(const torch::Tensor& param) const;  // its gradient is a view into this domain's buffer
  void finalize_grads();
  void enable_grad_overlap(int64_t bucket_numel);
  void arm_grad_overlap();
  void complete_grads_later(const std::vector<torch::Tensor>& params);
  void grad_done(const void* param);
  void allocate_grad_of(const torch::Tensor& param) {  // sharded gradients' (MixedPrecisionOptimizer)
    if (sharded_grads_) sharded_grads_->prepare_for(param);
  }
  // `with_optimizer_step` (--overlap-param-gather-with-optimizer-step): update() steps the first
  // model chunk's parameters first and issues their all-gather before it steps the others'.
  void enable_param_gather_overlap(int64_t bucket_numel, bool with_optimizer_step = false);
  void wait_for_params(const torch::nn::Module& module);
  void finish_param_gather();
  bool param_gather_overlapped() const { return param_gather_ != nullptr; }
  // The parameter all-gather buckets issued while the optimizer step still had parameters to
  // update (with_optimizer_step), summed over the steps so far.
  int64_t param_gathers_during_step() const { return gathers_during_step_; }
  // Megatron-FSDP's optim_grads_params (ZeRO-3, parallel/sharded_weights.h): with the distributed
  // optimizer over more than one rank, the model weights are kept as this rank's shard only and
  // gathered unit by unit around their use. `units`: the model's parameters grouped by the module
  // that uses them, in forward order (another domain's are skipped). `policy`: prefetching
  // (--overlap-param-gather) and keeping units from forward to backward
  // (--torch-fsdp2-no-reshard-after-forward). Call once, after enable_byte_publish and
  // complete_grads_later if any, before enable_grad_overlap. With `shard_grads` the gradients
  // follow the same units: reduce-scattered unit by unit in every backward pass.
  void shard_model_params(const std::vector<std::vector<torch::Tensor>>& units, GatherPolicy policy);
  const ShardedWeights* sharded_weights() const { return sharded_.get(); }
  const ShardedGrads* sharded_grads() const { return sharded_grads_.get(); }
  // After `module`'s forward pass (its outputs): releases its sharded weights (no-op unsharded).
  void release_params(const torch::nn::Module& module, const std::vector<torch::Tensor>& outputs);
  // Gathers every sharded weight (for readers of the whole model); unsharded: finish_param_gather().
  void gather_all_params();
  // After such a reader: every sharded weight released again (no-op unsharded).
  void release_all_params();
  // Megatron-FSDP's optim strategy: the distributed optimizer's state sharding with the gradients
  // all-reduced over the data-parallel group (every rank holds them all), not reduce-scattered.
  // Call before enable_grad_overlap.
  void all_reduce_sharded_grads();

  // The step in three parts so that one global norm covers every domain:
  // fp32 grads laid out from shard_begin(), divided by `divisor` (a device scalar: the loss scale,
  // times the global loss-token count with --calculate-per-token-loss; undefined: 1).
  torch::Tensor unscaled_grads(const torch::Tensor& divisor);
  torch::Tensor norm_squared(const torch::Tensor& grads);  // summed over the domain's groups
  // Zero elements of `grads` (Megatron's count_zeros_fp32: each parameter once), summed over the
  // domain's groups; float64.
  torch::Tensor zeros_in(const torch::Tensor& grads);
  // `clip_coeff`: see folds_clipping. `group_lrs`: the learning rates of the groups that have their
  // own (--decoupled-lr, --use-mup); `lr` is the base group's.
  void update(const torch::Tensor& grads, double lr, double weight_decay, const torch::Tensor& found_inf,
              const torch::Tensor& clip_coeff = {}, const GroupLrs& group_lrs = {});
  // Whether update() applies a clip coefficient inside the fused Adam kernel (the GPU path: saves a
  // read-modify-write pass over every gradient) instead of the caller scaling the gradients. Not
  // with Muon: its Newton-Schulz path reads the gradients outside the fused kernel.
  bool folds_clipping(const torch::Tensor& grads) const;
  // Muon: the fused QKV weight's rows per query group (Q heads, K, V), for splitting it.
  void set_qkv_rows(const std::vector<int64_t>& rows);
  torch::Tensor params_norm_squared();
  // After a step whose gradient norm was not finite: the name of the first of this rank's
  // parameters of the domain, in the model's order, whose gradient (as the step saw it) holds NaN
  // or inf; nullopt when none does. One check per parameter: for the error report only.
  std::optional<std::string> first_nonfinite_grad() const;

  int64_t num_parameters() const { return numel_; }
  // The whole gradient buffer (undefined with sharded gradients).
  const torch::Tensor& main_grads() const { return main_grads_; }

  // ---- for checkpoints: where each parameter and its optimizer state live ----
  struct ParamSlot {
    std::string name;
    int64_t offset = 0, numel = 0;  // in the flat buffers
    std::vector<int64_t> shape;     // this rank's shard
    ParamInfo info;
    bool muon = false;  // updated by Muon: its state is the momentum alone (Adam's: both moments)
  };
  const std::vector<ParamSlot>& param_slots() const { return slots_; }  // in buffer order
  bool distributed() const { return distributed_; }
  // The fp32 main weights and Adam states (exp_avg is SGD's momentum) hold the elements
  // [shard_begin, shard_begin + shard_numel) of the flat buffer: all of it, or with
  // --use-distributed-optimizer this rank's shard (the padding included).
  int64_t shard_begin() const { return shard_begin_; }
  int64_t shard_numel() const { return shard_numel_; }
  // The model weights this rank holds: the whole buffer, or with sharded weights its shard
  // [shard_begin, shard_begin + shard_numel) (params_sharded()).
  torch::Tensor model_params() const { return sharded_ ? model_params_ : model_params_.narrow(0, 0, numel_); }
  bool params_sharded() const { return sharded_ != nullptr; }
  // The fp32 main weights; undefined where they are stored in fp16 scaled per parameter
  // (--main-params-dtype fp16 of the precision-aware optimizer): main_values() reads them.
  torch::Tensor main_params() const { return main_params_; }
  // The main weights' values in fp32: the buffer itself, or a copy read back from fp16.
  torch::Tensor main_values() const;
  // The stored fp16 main weights (undefined with fp32 ones).
  torch::Tensor main_codes() const { return scaled_main_ ? scaled_main_->stored() : torch::Tensor(); }
  // The stored moments (fp16 / float8_e4m3fn codes where they are scaled per parameter, see
  // scaled_state.h).
  torch::Tensor exp_avg() const { return exp_avg_; }
  torch::Tensor exp_avg_sq() const { return exp_avg_sq_; }  // undefined for SGD
  // The main weights and moments as checkpoints hold them, as Transformer Engine's FusedAdam hands
  // them to Megatron's checkpoints: fp32 copies on the host where they are scaled per parameter
  // (fp16, fp8), otherwise the buffers themselves.
  torch::Tensor main_params_to_save() const;
  std::pair<torch::Tensor, torch::Tensor> moments_to_save() const;
  // What a checkpoint load writes the main weights and moments into: the buffers themselves, or
  // fp32 host copies of scaled states (holding their current values) that adopt_loaded_states()
  // stores scaled once every read has succeeded; a failed load drops them and changes nothing.
  torch::Tensor main_params_to_load();
  std::pair<torch::Tensor, torch::Tensor> moments_to_load();
  // With fp16 main weights, where a load reads the model weights too (undefined otherwise): this
  // rank's shard of the model buffer [shard_begin, shard_begin + shard_numel). The step writes the
  // model weights from the fp32 values before the main weights are rounded to fp16 (as TE's
  // FusedAdam does), so casting the main weights back would not give them; after such a read
  // publish_model_params() publishes the shard as read.
  torch::Tensor model_shard_to_load();
  void adopt_loaded_states();
  double step_count() const;  // 0 for an empty domain
  void set_step_count(double steps);
  // Model parameters := main weights (cast; all-gathered over the domain's data-parallel group
  // with the distributed optimizer). Waits.
  void publish_model_params();
  // Adam on CUDA runs the optimizer's own fused kernel (optim/fused_adamw.h), which also
  // writes the model parameters' copy of each segment; `true` goes back to torch's _fused_adamw_
  // followed by the separate copy, for tests comparing the two.
  void use_torch_adam_kernel(bool on) { torch_adam_kernel_ = on; }

 private:
  struct Segment {
    int64_t offset, numel;
    bool decay;
    double norm_weight;  // 1, 1/tp for tensor-parallel duplicates, 0 for the tied-embedding copy
    LrGroup lr_group = LrGroup::Base;
    bool muon = false;      // updated by Muon (2-D hidden weights with --optimizer muon)
    double eps_mult = 1.0;  // Adam's epsilon is --adam-eps times this (MuP's hidden parameters)
  };
  struct MuonSlot {
    int64_t offset;              // in the flat buffers
    std::vector<int64_t> shape;  // this rank's shard
    MuonParam param;
  };
  using Ranges = std::vector<std::pair<int64_t, int64_t>>;  // (offset, numel) in the flat buffers
  void muon_step(const Segment& s, const torch::Tensor& grads, double lr, double wd, const torch::Tensor& found_inf);
  // Adam over this rank's part [lo, lo + n) of a segment; returns whether the model parameters of
  // that range were written too (the fused kernel's copy).
  bool adam_step(size_t segment, int64_t lo, int64_t n, const torch::Tensor& grads, double lr, double wd, double eps,
                 const torch::Tensor& found_inf, const std::optional<torch::Tensor>& grad_divisor);
  // Adam over the whole parameters inside [lo, lo + n) with states scaled per parameter (moments,
  // main weights): each parameter's states read back to fp32, stepped, stored with new scales.
  // Returns whether the model parameters of the range were written too (the fused kernel's copy;
  // always with scaled main weights, from the fp32 values before they are stored).
  bool scaled_adam_step(size_t segment, int64_t lo, int64_t n, const torch::Tensor& grads, double lr, double wd,
                        double eps, const torch::Tensor& found_inf, const std::optional<torch::Tensor>& grad_divisor);
  // The fused kernel's step (optim/scaled_adamw_kernels.h) over pieces [first, last) of the scaled
  // states (the other states plain fp32 or bf16), writing the model parameters' copy where they
  // are a buffer of their own.
  void fused_scaled_adam_step(size_t segment, size_t first, size_t last, const torch::Tensor& grads, double lr, double wd,
                              double eps, const torch::Tensor& found_inf, const std::optional<torch::Tensor>& grad_divisor);
  // (Re)creates the zeroed moments for this rank's shard.
  void make_moments(const torch::TensorOptions& device);
  // Each parameter's (offset, numel) inside this rank's shard: the pieces of its scaled states.
  std::vector<std::pair<int64_t, int64_t>> state_pieces() const;
  // fp32 on the optimizer's device.
  torch::TensorOptions state_options() const { return model_params_.options().dtype(torch::kFloat32); }
  // Which parameters an update_ranges() call steps: all, or (--overlap-param-gather-with-optimizer-step)
  // the first model chunk's and then the others'.
  enum class UpdatePart { kAll, kFirstChunk, kOtherChunks };
  // The update of this rank's part of the buffer; appends to `published` the ranges whose model
  // parameters the fused Adam kernel wrote.
  void update_ranges(UpdatePart part, const torch::Tensor& grads, double lr, double weight_decay,
                     const torch::Tensor& found_inf, const std::optional<torch::Tensor>& grad_divisor,
                     const GroupLrs& group_lrs, Ranges& published);
  // The first model chunk's parameters stepped and their all-gather issued, then the others'.
  void update_first_chunk_first(const torch::Tensor& grads, double lr, double weight_decay,
                                const torch::Tensor& found_inf, const std::optional<torch::Tensor>& grad_divisor,
                                const GroupLrs& group_lrs);
  // This rank's model parameters (its shard with the distributed optimizer) within `within`
  // (default: all) := main weights, except in `published` (sorted, disjoint ranges already
  // written by the step).
  void copy_main_to_model(const Ranges& published);
  void copy_main_to_model(const Ranges& published, const Ranges& within);
  void publish_model_params(const Ranges& published);
  torch::Tensor global_norm_squared(const torch::Tensor& buffer, int64_t base);
  void all_reduce_model_groups(torch::Tensor& value);
  // Sums the partial (reduce_grad_over_tp) gradients in `grads`, the flat-buffer elements from `base`.
  void sum_tensor_parallel_partials(torch::Tensor grads, int64_t base);
  void sum_embedding_copies();
  void take_own_grad_shard();  // grad_shard_ from the reduced buffer (a no-op when it is a view of it)
  void finalize_sharded_grads();
  // Whether a unit's gradients must stay whole until the step's end (sharded gradients): summed
  // over the pipeline's embedding group first, or completed by held work after autograd.
  bool grads_kept_whole(const std::vector<BufferParam>& unit) const;
  // Whether `p` is a tied embedding's copy that the pipeline's first and last stage sum.
  bool summed_over_stages(const BufferParam& p) const;
  void encode_own_shard();
  void gather_and_decode();
  int dp_size() const { return groups_.dp->size(); }
  int shard_ranks() const { return groups_.shard->size(); }

  OptimizerConfig config_;
  DomainGroups groups_;
  bool distributed_;
  std::unique_ptr<GradBuckets> buckets_;
  std::unique_ptr<ParamGather> param_gather_;
  // --overlap-param-gather-with-optimizer-step: the buffer ranges of the first model chunk (the
  // padding after the last parameter goes with that parameter's chunk) and of the others.
  Ranges first_chunk_ranges_, other_chunk_ranges_;
  int64_t gathers_during_step_ = 0;
  std::unique_ptr<ShardedWeights> sharded_;  // shard_model_params()
  bool shard_grads_ = false;                  // the constructor's, where the domain is distributed
  std::unique_ptr<ShardedGrads> sharded_grads_;
  std::vector<torch::Tensor> completed_later_;  // complete_grads_later()
  std::unordered_set<const void*> own_params_;  // TensorImpls of this domain's parameters
  bool all_reduce_grads_ = false;            // all_reduce_sharded_grads()
  std::vector<BufferParam> buffer_order_;  // parameters in flat-buffer order
  bool separate_main_weights_;
  int64_t numel_ = 0, padded_numel_ = 0, shard_begin_ = 0, shard_numel_ = 0;
  std::vector<Segment> segments_;
  std::vector<std::pair<int64_t, int64_t>> tp_partial_ranges_;  // (offset, numel)
  std::vector<std::pair<int64_t, int64_t>> embedding_ranges_;
  torch::Tensor model_params_;  // flat, parameter dtype (padded); with sharded weights this rank's shard
  int64_t model_base_ = 0;      // the flat-buffer index of model_params_'s element 0
  torch::Tensor main_params_;   // fp32: the whole buffer, or this rank's shard
  torch::Tensor main_grads_;    // flat (padded), fp32 or parameter dtype; undefined with sharded gradients
  torch::Dtype grads_dtype_ = torch::kFloat32;
  torch::Tensor grad_shard_;    // distributed optimizer: this rank's reduced gradients (fp32; a view of an fp32 buffer)
  torch::Tensor exp_avg_, exp_avg_sq_;
  // The precision-aware optimizer's fp16/fp8 moments (exp_avg_/exp_avg_sq_ are their codes) and
  // fp16 main weights (main_params_ is then undefined).
  std::unique_ptr<ScaledState> scaled_exp_avg_, scaled_exp_avg_sq_, scaled_main_;
  // moments_to_load()'s and main_params_to_load()'s copies of scaled states.
  torch::Tensor loading_exp_avg_, loading_exp_avg_sq_, loading_main_;
  bool model_shard_loaded_ = false;  // model_shard_to_load() was handed out
  // --fp8-param-gather: [0, byte_numel_) of the buffer is published as bytes through `codes_`.
  int64_t byte_numel_ = 0;
  torch::Tensor codes_;  // uint8, like model_params_
  int64_t codes_base_ = 0;  // the flat-buffer index of codes_'s element 0 (sharded weights: the shard's)
  BytePublish byte_publish_;
  std::vector<torch::Tensor> step_counts_;  // one per segment
  std::vector<ParamSlot> slots_;
  std::vector<MuonSlot> muon_slots_;
  std::vector<std::pair<int64_t, int64_t>> zeroed_ranges_;  // (offset, numel) zero_grad() clears
  bool zero_all_ = true;                                     // until skip_zeroing(): all of main_grads_
  bool torch_adam_kernel_ = false;                           // use_torch_adam_kernel()
};

}  // namespace fp8tron
