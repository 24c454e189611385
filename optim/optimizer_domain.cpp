#include "optim/optimizer_domain.h"

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>
#include <unordered_map>
#include <utility>

#include "core/error.h"
#include "optim/buffer_layout.h"
#include "optim/fused_adamw.h"
#include "optim/scaled_adamw_kernels.h"
#include "optim/param_groups.h"
#include "parallel/parallel_state.h"

namespace fp8tron {
namespace {
// Megatron's parameter groups (optim/param_groups.h).
bool decays(const NamedParam& p, const OptimizerConfig& c) { return applies_weight_decay(p.name, p.tensor.dim(), c); }
LrGroup group_of(const NamedParam& p, const OptimizerConfig& c) { return lr_group(p.name, p.tensor.dim(), c); }
double eps_mult(const NamedParam& p, const OptimizerConfig& c) { return adam_eps_mult(p.name, p.tensor.dim(), c); }
bool muon(const NamedParam& p, const OptimizerConfig& c) { return uses_muon(p.name, p.tensor.dim(), c); }
torch::Dtype to_torch(ParamDtype d) {
  return d == ParamDtype::Bf16 ? torch::kBFloat16 : d == ParamDtype::Fp16 ? torch::kFloat16 : torch::kFloat32;
}
// The storage of an unscaled optimizer state (fp16 and fp8 ones are ScaledStates).
torch::Dtype state_dtype(StateDtype d) {
  FP8TRON_CHECK(d == StateDtype::Fp32 || d == StateDtype::Bf16, "unscaled optimizer states are fp32 or bf16");
  return d == StateDtype::Bf16 ? torch::kBFloat16 : torch::kFloat32;
}
// How a parameter counts in the global gradient norm: 0 normal, 1 duplicated over tensor-parallel
// ranks (counted once), 2 the last stage's tied-embedding copy (not counted).
int norm_class(const NamedParam& p) {
  if (p.info.shared_embedding_copy) return 2;
  return p.info.partition_dim < 0 ? 1 : 0;
}
// One distributed-optimizer instance unless the caller split the data-parallel group.
DomainGroups with_instances(DomainGroups g) {
  if (!g.shard) g.shard = g.dp;
  if (!g.instances) {
    const int global_rank = g.dp->global_ranks()[size_t(g.dp->rank())];
    g.instances = make_self_communicator(g.name + "-inter-instance", global_rank);
  }
  FP8TRON_CHECK(g.shard->size() * g.instances->size() == g.dp->size(),
                "optimizer instances must tile the data-parallel group");
  return g;
}
}  // namespace

OptimizerDomain::OptimizerDomain(const std::vector<NamedParam>& params, const OptimizerConfig& optimizer,
                                 const PrecisionConfig& precision, DomainGroups groups, bool distributed, torch::Device device,
                                 const std::vector<torch::Tensor>& byte_params, bool shard_grads)
    : config_(optimizer),
      groups_(with_instances(std::move(groups))),
      distributed_(distributed && shard_ranks() > 1),
      shard_grads_(shard_grads && distributed_),
      separate_main_weights_(precision.params_dtype != ParamDtype::Fp32 || distributed_) {
  torch::NoGradGuard no_grad;
  // Order: Adam/SGD before Muon parameters, decay first; within it the byte-published ones, then
  // by learning-rate group and Adam epsilon, normal, TP-duplicated (partial-gradient ones first),
  // excluded.
  std::vector<const NamedParam*> ordered;
  for (const auto& p : params) ordered.push_back(&p);
  auto model_order = [&](const NamedParam* p) { return int64_t(p - params.data()); };
  const OptimizerConfig& c = config_;
  // Byte-published parameters (FP8 linears' weights: Adam, decayed) come first.
  auto published_as_bytes = [&](const NamedParam* p) {
    for (const auto& b : byte_params)
      if (b.is_same(p->tensor)) return true;
    return false;
  };
  std::stable_sort(ordered.begin(), ordered.end(), [&](const NamedParam* a, const NamedParam* b) {
    auto key = [&](const NamedParam* p) {
      return std::make_tuple(muon(*p, c), !decays(*p, c), !published_as_bytes(p), group_of(*p, c), -eps_mult(*p, c),
                             norm_class(*p), !p->info.reduce_grad_over_tp);
    };
    return key(a) < key(b);
  });
  for (const auto* p : ordered) {
    if (!published_as_bytes(p)) break;
    byte_numel_ += p->tensor.numel();
  }
  // Muon's matrices stay whole on one data-parallel rank with the distributed optimizer
  // (Megatron's layer-wise distributed optimizer, optim/buffer_layout.h); everything
  // else is sharded elementwise.
  std::vector<LayoutParam> sizes;
  for (const auto* p : ordered) {
    const bool whole = muon(*p, c);
    const int64_t n = p->tensor.numel();
    sizes.push_back(LayoutParam{n, whole, whole ? newton_schulz_cost(p->tensor.size(0), p->tensor.size(1)) : double(n)});
  }
  const BufferLayout layout = plan_buffer_layout(sizes, distributed_ ? shard_ranks() : 1);
  std::vector<size_t> by_offset(ordered.size());
  for (size_t i = 0; i < by_offset.size(); ++i) by_offset[i] = i;
  std::stable_sort(by_offset.begin(), by_offset.end(), [&](size_t a, size_t b) { return layout.offsets[a] < layout.offsets[b]; });
  numel_ = layout.numel;
  padded_numel_ = distributed_ ? layout.shard_numel * shard_ranks() : numel_;
  shard_numel_ = distributed_ ? layout.shard_numel : numel_;
  shard_begin_ = distributed_ ? shard_numel_ * groups_.shard->rank() : 0;

  const int tp_size = groups_.tp->size();
  const double tp = double(tp_size);
  const bool pipeline_copies = groups_.embedding && groups_.embedding->size() > 1;
  const auto fp32 = torch::TensorOptions().device(device).dtype(torch::kFloat32);
  const auto param_dtype = to_torch(precision.params_dtype);
  // The fp32 main weights: this rank's shard only with the distributed optimizer (a whole fp32
  // copy of the model beside the other buffers would set the run's peak memory at start-up);
  // without separate main weights the model's own fp32 buffer is the main copy.
  main_params_ = torch::zeros({shard_numel_}, fp32);
  model_params_ = separate_main_weights_ ? torch::zeros({padded_numel_}, fp32.dtype(param_dtype)) : main_params_;
  for (size_t i : by_offset) {
    const NamedParam* p = ordered[i];
    const int64_t offset = layout.offsets[i], n = p->tensor.numel();
    const bool decay = decays(*p, c), is_muon = muon(*p, c);
    const LrGroup group = group_of(*p, c);
    const double eps = eps_mult(*p, c);
    const double w = norm_class(*p) == 0 ? 1.0 : norm_class(*p) == 1 ? 1.0 / tp : 0.0;
    // A segment is a contiguous run of equally treated parameters (padding ends it).
    if (segments_.empty() || segments_.back().decay != decay || segments_.back().norm_weight != w ||
        segments_.back().lr_group != group || segments_.back().muon != is_muon || segments_.back().eps_mult != eps ||
        segments_.back().offset + segments_.back().numel != offset)
      segments_.push_back(Segment{offset, 0, decay, w, group, is_muon, eps});
    if (is_muon) muon_slots_.push_back(MuonSlot{offset, p->tensor.sizes().vec(), MuonParam{p->info, is_fused_qkv(p->name), {}}});
    segments_.back().numel += n;
    auto add_range = [&](std::vector<std::pair<int64_t, int64_t>>& ranges) {
      if (!ranges.empty() && ranges.back().first + ranges.back().second == offset) ranges.back().second += n;
      else ranges.emplace_back(offset, n);
    };
    if (p->info.reduce_grad_over_tp && tp_size > 1) add_range(tp_partial_ranges_);
    // The tied embedding's two copies (first and last stage) sum their gradients.
    if ((p->info.tied_embedding || p->info.shared_embedding_copy) && pipeline_copies) add_range(embedding_ranges_);
    torch::Tensor t = p->tensor;
    const auto values = t.detach().reshape({-1});  // as initialised
    const int64_t lo = std::max(offset, shard_begin_), hi = std::min(offset + n, shard_begin_ + shard_numel_);
    if (hi > lo) main_params_.narrow(0, lo - shard_begin_, hi - lo).copy_(values.narrow(0, lo - offset, hi - lo));
    if (separate_main_weights_) model_params_.narrow(0, offset, n).copy_(values);
    t.set_data(model_params_.narrow(0, offset, n).view(t.sizes()));
    buffer_order_.push_back({t, offset, n, model_order(p), p->chunk});
    own_params_.insert(t.unsafeGetTensorImpl());
    slots_.push_back(ParamSlot{p->name, offset, n, t.sizes().vec(), p->info, is_muon});
  }
  // --main-params-dtype fp16 (precision-aware): the main weights stored scaled per parameter, from
  // the fp32 values just laid out, which go before the gradient buffer comes.
  const PrecisionAwareOptimizer& aware = config_.precision_aware;
  if (aware.enabled && aware.main_params == StateDtype::Fp16) {
    FP8TRON_CHECK(separate_main_weights_, "fp16 main weights need model weights of their own (--bf16 or --fp16)");
    scaled_main_ = std::make_unique<ScaledState>(StateDtype::Fp16, shard_numel_, state_pieces(), fp32);
    scaled_main_->store_all(main_params_);
    main_params_ = torch::Tensor();
  }
  // Gradients accumulate in place into the flat buffer. AccumulateGrad adds each new
  // (parameter-dtype) gradient into an existing .grad with `+=`, so an fp32 buffer under a bf16
  // parameter accumulates micro-batches in fp32, as Megatron's main_grad does. (Allocated once the
  // weights as initialised are gone: the whole fp32 model beside it set the start-up peak.)
  grads_dtype_ = precision.grads_in_fp32 ? torch::kFloat32 : param_dtype;
  if (!shard_grads_) {
    main_grads_ = torch::zeros({padded_numel_}, fp32.dtype(grads_dtype_));
    for (auto& p : buffer_order_) p.tensor.mutable_grad() = main_grads_.narrow(0, p.offset, p.numel).view(p.tensor.sizes());
  }
  // The reduced fp32 gradients the optimizer steps on: with the distributed optimizer and fp32
  // gradients this rank's own range of the buffer, which the reduce-scatter writes in place (as
  // Megatron's), else (gradients accumulated in 16 bits, or sharded per unit) a buffer of its own.
  if (distributed_ && !shard_grads_ && grads_dtype_ == torch::kFloat32)
    grad_shard_ = main_grads_.narrow(0, shard_begin_, shard_numel_);
  else if (distributed_ || grads_dtype_ != torch::kFloat32)
    grad_shard_ = torch::zeros({shard_numel_}, fp32);
  make_moments(fp32);
  for (size_t i = 0; i < segments_.size(); ++i) step_counts_.push_back(torch::zeros({}, fp32));
}

void OptimizerDomain::enable_grad_overlap(int64_t bucket_numel) {
  if (dp_size() == 1) return;  // nothing to reduce
  // Sharded gradients are reduced unit by unit as they complete, overlapped with the rest of the
  // backward pass, with or without the flag (as Megatron-FSDP's).
  if (shard_grads_) return;
  if (main_grads_.scalar_type() != torch::kFloat32 && !main_grads_.is_cuda())
    throw UserError("--overlap-grad-reduce on CPU needs fp32 gradients (--bf16 without --main-grads-dtype bf16, or "
                    "--accumulate-allreduce-grads-in-fp32)");
  GradBuckets::Options options;
  options.bucket_numel = bucket_numel;
  const bool scatter = distributed_ && !all_reduce_grads_;  // onto the shards' owners
  if (scatter) {
    options.shard_numel = shard_numel_;
    // The tied embedding's copies lie at different offsets on the first and last stage, so their
    // shard owners differ: they must be summed before the data-parallel reduction (Megatron gives
    // them a bucket of their own for the same reason).
    if (groups_.embedding && groups_.embedding->size() > 1) options.deferred = embedding_ranges_;
    options.replicas = groups_.instances;
  }
  auto group = scatter ? groups_.shard : groups_.dp;  // the instance's ranks own the shards
  buckets_ = std::make_unique<GradBuckets>(main_grads_, buffer_order_, options, group);
  buckets_->complete_later(completed_later_);
}

void OptimizerDomain::arm_grad_overlap() {
  if (buckets_) buckets_->arm();
}

void OptimizerDomain::complete_grads_later(const std::vector<torch::Tensor>& params) {
  for (const auto& p : params)
    if (holds(p)) completed_later_.push_back(p);
  if (buckets_) buckets_->complete_later(completed_later_);
}

void OptimizerDomain::grad_done(const void* param) {
  if (buckets_) buckets_->param_done(param);
}

void OptimizerDomain::enable_byte_publish(BytePublish publish) {
  int64_t numel = 0;
  for (const auto& p : publish.params) numel += p.numel();
  FP8TRON_CHECK(numel == byte_numel_ && byte_numel_ > 0, "byte-published parameters must be the constructor's");
  FP8TRON_CHECK(!scaled_main_, "parameters published as bytes are encoded from fp32 main weights");
  FP8TRON_CHECK(!param_gather_, "enable_byte_publish comes before enable_param_gather_overlap");
  if (!separate_main_weights_)
    throw UserError("--fp8-param-gather needs fp32 main weights separate from the model's: train with --bf16, or "
                    "with --use-distributed-optimizer over more than one data-parallel rank per optimizer instance");
  codes_ = torch::zeros({padded_numel_}, model_params_.options().dtype(torch::kUInt8));
  byte_publish_ = std::move(publish);
}

void OptimizerDomain::encode_own_shard() {
  // This rank's part of the byte-published range, from its fp32 main weights.
  // (An empty range where this rank's shard lies past the byte-published elements: every rank
  // takes part in encode's reduction.)
  const int64_t hi = std::min(shard_begin_ + shard_numel_, byte_numel_), lo = std::min(shard_begin_, hi);
  const bool empty = hi == lo;
  const auto main = empty ? main_params_.narrow(0, 0, 0) : main_params_.narrow(0, lo - shard_begin_, hi - lo);
  auto codes = empty ? codes_.narrow(0, 0, 0) : codes_.narrow(0, lo - codes_base_, hi - lo);
  byte_publish_.encode(main, codes, lo);
}

// The byte range and the rest of the buffer, each all-gathered from the shards' owners.
void OptimizerDomain::gather_and_decode() {
  if (distributed_) {
    const int ranks = shard_ranks();
    Communicator& shard = *groups_.shard;
    auto own = [&](torch::Tensor& buffer, int64_t offset, int64_t numel) {
      const int64_t lo = std::clamp(shard_begin_, offset, offset + numel);
      const int64_t hi = std::clamp(shard_begin_ + shard_numel_, offset, offset + numel);
      return buffer.narrow(0, lo, hi - lo);
    };
    auto codes = codes_.narrow(0, 0, byte_numel_);
    shard.wait(*shard.all_gather_v_async(codes, own(codes_, 0, byte_numel_),
                                         shard_counts(0, byte_numel_, shard_numel_, ranks)));
    auto rest = model_params_.narrow(0, byte_numel_, padded_numel_ - byte_numel_);
    shard.wait(*shard.all_gather_v_async(rest, own(model_params_, byte_numel_, padded_numel_ - byte_numel_),
                                         shard_counts(byte_numel_, padded_numel_ - byte_numel_, shard_numel_, ranks)));
  } else {
    model_params_.narrow(0, byte_numel_, numel_ - byte_numel_).copy_(main_params_.narrow(0, byte_numel_, numel_ - byte_numel_));
  }
  byte_publish_.decode(codes_.narrow(0, 0, byte_numel_), 0, byte_numel_);
}

void OptimizerDomain::enable_param_gather_overlap(int64_t bucket_numel, bool with_optimizer_step) {
  // One data-parallel rank holds everything: nothing to gather. Sharded weights are gathered per
  // unit, prefetching (shard_model_params).
  if (!distributed_ || sharded_) return;
  ParamGather::Bytes bytes;
  if (codes_.defined()) bytes = {codes_, byte_numel_, byte_publish_.decode};
  param_gather_ = std::make_unique<ParamGather>(model_params_, buffer_order_, bucket_numel, shard_numel_, groups_.shard,
                                                bytes, with_optimizer_step);
  if (!with_optimizer_step) return;
  // Refused by the flag's rule; the chunk-by-chunk update needs elementwise updates and values
  // published as they are.
  FP8TRON_CHECK(muon_slots_.empty() && !codes_.defined(),
                "the parameter gather overlaps the optimizer step with elementwise optimizers and values only");
  first_chunk_ranges_.clear();
  other_chunk_ranges_.clear();
  for (size_t i = 0; i < buffer_order_.size(); ++i) {
    const BufferParam& p = buffer_order_[i];
    const int64_t end = i + 1 == buffer_order_.size() ? padded_numel_ : p.offset + p.numel;  // with the padding
    Ranges& ranges = p.chunk == 0 ? first_chunk_ranges_ : other_chunk_ranges_;
    if (!ranges.empty() && ranges.back().first + ranges.back().second == p.offset)
      ranges.back().second = end - ranges.back().first;
    else
      ranges.emplace_back(p.offset, end - p.offset);
  }
}

void OptimizerDomain::wait_for_params(const torch::nn::Module& module) {
  if (param_gather_) param_gather_->wait_for(module);
  if (sharded_) sharded_->gather_for(module);
}

void OptimizerDomain::finish_param_gather() {
  if (param_gather_) param_gather_->finish();
}

void OptimizerDomain::shard_model_params(const std::vector<std::vector<torch::Tensor>>& units, GatherPolicy policy) {
  torch::NoGradGuard no_grad;
  if (!distributed_) return;  // one rank per optimizer instance holds every weight anyway
  FP8TRON_CHECK(!sharded_ && !param_gather_, "shard_model_params comes once, before enable_param_gather_overlap");
  std::unordered_map<const void*, const BufferParam*> mine;
  for (const auto& p : buffer_order_) mine[p.tensor.unsafeGetTensorImpl()] = &p;
  // The optimizer states still hold zeros (no step or checkpoint load comes before this): they are
  // built again once the whole weight buffer is gone, so that the two never coexist.
  const auto device = state_options();
  exp_avg_ = exp_avg_sq_ = torch::Tensor();
  scaled_exp_avg_.reset();
  scaled_exp_avg_sq_.reset();
  // This rank's shard of the weights; the whole buffer goes once the parameters are units' views.
  model_params_ = model_params_.narrow(0, shard_begin_, shard_numel_).clone();
  model_base_ = shard_begin_;
  // --fp8-param-gather: the codes too are this rank's shard only; the units gather them.
  if (codes_.defined()) {
    codes_ = torch::zeros({shard_numel_}, codes_.options());
    codes_base_ = shard_begin_;
  }
  sharded_ = std::make_unique<ShardedWeights>(model_params_, groups_.shard, policy, codes_.defined() ? byte_numel_ : 0);
  size_t placed = 0;
  std::vector<std::vector<BufferParam>> unit_params;
  for (const auto& unit : units) {
    std::vector<BufferParam> params;
    for (const auto& t : unit)
      if (auto it = mine.find(t.unsafeGetTensorImpl()); it != mine.end()) params.push_back(*it->second);
    placed += params.size();
    sharded_->add_unit(params);
    if (!params.empty()) unit_params.push_back(std::move(params));
  }
  FP8TRON_CHECK(placed == buffer_order_.size(), "every parameter of a sharded domain must belong to exactly one unit");
  if (shard_grads_) {
    // The gradients live in the same units, reduced onto their owners as each unit's backward
    // pass completes (the weights' units are numbered alike: empty units add none).
    FP8TRON_CHECK(sharded_->num_units() == unit_params.size(), "sharded weights and gradients must have the same units");
    sharded_grads_ = std::make_unique<ShardedGrads>(grad_shard_, grads_dtype_, groups_.shard, groups_.instances);
    for (const auto& params : unit_params) sharded_grads_->add_unit(params, grads_kept_whole(params));
    ShardedGrads* grads = sharded_grads_.get();
    sharded_->follow_backward([grads](size_t unit) { grads->prepare(unit); }, [grads](size_t unit) { grads->reduce(unit); });
  }
  make_moments(device);
}

void OptimizerDomain::make_moments(const torch::TensorOptions& device) {
  // Adam's first moment, SGD's and Muon's momentum; the precision-aware optimizer (Adam only) may
  // store Adam's moments in bf16, or in fp16/fp8 scaled per parameter (this rank's part of it).
  const PrecisionAwareOptimizer& pa = config_.precision_aware;
  const StateDtype m = pa.enabled ? pa.exp_avg : StateDtype::Fp32, v = pa.enabled ? pa.exp_avg_sq : StateDtype::Fp32;
  const std::vector<std::pair<int64_t, int64_t>> pieces = state_pieces();
  auto make = [&](StateDtype d, std::unique_ptr<ScaledState>& scaled) {
    if (!ScaledState::scaled(d)) return torch::zeros({shard_numel_}, device.dtype(state_dtype(d)));
    scaled = std::make_unique<ScaledState>(d, shard_numel_, pieces, device);
    return scaled->stored();
  };
  exp_avg_ = make(m, scaled_exp_avg_);
  if (config_.optimizer == "adam" || config_.optimizer == "muon") exp_avg_sq_ = make(v, scaled_exp_avg_sq_);
}

std::vector<std::pair<int64_t, int64_t>> OptimizerDomain::state_pieces() const {
  std::vector<std::pair<int64_t, int64_t>> pieces;
  for (const ParamSlot& slot : slots_) {
    const int64_t lo = std::max(slot.offset, shard_begin_), hi = std::min(slot.offset + slot.numel, shard_begin_ + shard_numel_);
    if (lo < hi) pieces.emplace_back(lo - shard_begin_, hi - lo);
  }
  return pieces;
}

torch::Tensor OptimizerDomain::main_values() const {
  return scaled_main_ ? scaled_main_->unscaled_range(0, shard_numel_) : main_params_;
}

torch::Tensor OptimizerDomain::main_params_to_save() const {
  return scaled_main_ ? scaled_main_->unscaled_copy(torch::kCPU) : main_params_;
}

torch::Tensor OptimizerDomain::main_params_to_load() {
  model_shard_loaded_ = false;  // until model_shard_to_load() is asked for
  if (!scaled_main_) return main_params_;
  loading_main_ = scaled_main_->unscaled_copy(torch::kCPU);
  return loading_main_;
}

torch::Tensor OptimizerDomain::model_shard_to_load() {
  if (!scaled_main_) return {};
  model_shard_loaded_ = true;
  return model_params_.narrow(0, shard_begin_ - model_base_, shard_numel_);
}

std::pair<torch::Tensor, torch::Tensor> OptimizerDomain::moments_to_save() const {
  auto of = [](const torch::Tensor& stored, const std::unique_ptr<ScaledState>& scaled) {
    return scaled ? scaled->unscaled_copy(torch::kCPU) : stored;
  };
  return {of(exp_avg_, scaled_exp_avg_), of(exp_avg_sq_, scaled_exp_avg_sq_)};
}

std::pair<torch::Tensor, torch::Tensor> OptimizerDomain::moments_to_load() {
  auto of = [](const torch::Tensor& stored, const std::unique_ptr<ScaledState>& scaled, torch::Tensor& loading) {
    if (!scaled) return stored;
    loading = scaled->unscaled_copy(torch::kCPU);
    return loading;
  };
  return {of(exp_avg_, scaled_exp_avg_, loading_exp_avg_), of(exp_avg_sq_, scaled_exp_avg_sq_, loading_exp_avg_sq_)};
}

void OptimizerDomain::adopt_loaded_states() {
  torch::NoGradGuard no_grad;
  if (loading_exp_avg_.defined()) scaled_exp_avg_->store_all(loading_exp_avg_);
  if (loading_exp_avg_sq_.defined()) scaled_exp_avg_sq_->store_all(loading_exp_avg_sq_);
  if (loading_main_.defined()) scaled_main_->store_all(loading_main_);
  loading_exp_avg_ = loading_exp_avg_sq_ = loading_main_ = torch::Tensor();
}

bool OptimizerDomain::summed_over_stages(const BufferParam& p) const {
  if (!groups_.embedding || groups_.embedding->size() == 1) return false;
  for (auto [offset, n] : embedding_ranges_)
    if (p.offset < offset + n && offset < p.offset + p.numel) return true;
  return false;
}

bool OptimizerDomain::grads_kept_whole(const std::vector<BufferParam>& unit) const {
  for (const auto& p : unit) {
    if (summed_over_stages(p)) return true;
    for (const auto& later : completed_later_)
      if (later.is_same(p.tensor)) return true;
  }
  return false;
}

void OptimizerDomain::release_params(const torch::nn::Module& module, const std::vector<torch::Tensor>& outputs) {
  if (sharded_) sharded_->release_for(module, outputs);
}

void OptimizerDomain::gather_all_params() {
  finish_param_gather();
  if (sharded_) sharded_->gather_all();
}

void OptimizerDomain::release_all_params() {
  if (sharded_) sharded_->release_all();
}

void OptimizerDomain::all_reduce_sharded_grads() {
  FP8TRON_CHECK(!buckets_, "all_reduce_sharded_grads comes before enable_grad_overlap");
  if (distributed_ && groups_.instances->size() > 1)
    throw UserError("--data-parallel-sharding-strategy optim does not compose with --num-distributed-optimizer-instances > 1: "
                    "use optim_grads");
  all_reduce_grads_ = true;
}

void OptimizerDomain::zero_grad() {
  if (shard_grads_) {
    FP8TRON_CHECK(sharded_grads_ != nullptr, "sharded gradients need shard_model_params()");
    sharded_grads_->zero();
    return;
  }
  if (zero_all_) {
    main_grads_.zero_();
    return;
  }
  for (auto [offset, n] : zeroed_ranges_) main_grads_.narrow(0, offset, n).zero_();
}

bool OptimizerDomain::holds(const torch::Tensor& param) const {
  return param.defined() && own_params_.count(param.unsafeGetTensorImpl()) > 0;
}

void OptimizerDomain::skip_zeroing(const std::vector<torch::Tensor>& params) {
  if (shard_grads_) return;  // each unit's buffer is zeroed as its backward pass starts
  std::vector<std::pair<int64_t, int64_t>> skipped;
  const auto* base = static_cast<const char*>(main_grads_.data_ptr());
  for (const auto& p : params) {
    if (!holds(p)) continue;  // another domain's
    const torch::Tensor g = p.grad();
    FP8TRON_CHECK(g.defined() && g.scalar_type() == main_grads_.scalar_type(), "skip_zeroing: not a main-gradient view");
    const int64_t offset = (static_cast<const char*>(g.data_ptr()) - base) / int64_t(main_grads_.element_size());
    FP8TRON_CHECK(offset >= 0 && offset + g.numel() <= main_grads_.numel(), "skip_zeroing: gradient outside the buffer");
    skipped.emplace_back(offset, g.numel());
  }
  std::sort(skipped.begin(), skipped.end());
  zeroed_ranges_.clear();
  zero_all_ = false;
  int64_t at = 0;
  for (auto [offset, n] : skipped) {
    if (offset > at) zeroed_ranges_.emplace_back(at, offset - at);
    at = std::max(at, offset + n);
  }
  if (at < main_grads_.numel()) zeroed_ranges_.emplace_back(at, main_grads_.numel() - at);
}

void OptimizerDomain::sum_tensor_parallel_partials(torch::Tensor grads, int64_t base) {
  // `grads` holds the flat-buffer elements [base, base + grads.numel()). Tensor-parallel ranks lay
  // the buffer out identically, so with the distributed optimizer they own the same elements:
  // summing only those is enough once they are reduced onto their owners.
  const int64_t end = base + grads.numel();
  for (auto [off, n] : tp_partial_ranges_) {
    const int64_t lo = std::max(off, base), hi = std::min(off + n, end);
    if (hi <= lo) continue;
    auto view = grads.narrow(0, lo - base, hi - lo);
    groups_.tp->all_reduce(view);
  }
}

void OptimizerDomain::sum_embedding_copies() {
  if (!groups_.embedding || groups_.embedding->size() == 1) return;
  for (auto [off, n] : embedding_ranges_) {
    auto view = main_grads_.narrow(0, off, n);
    groups_.embedding->all_reduce(view);
  }
}

void OptimizerDomain::finalize_grads() {
  torch::NoGradGuard no_grad;
  if (sharded_) sharded_->release_all();  // weights whose gradients came outside autograd's accumulation
  if (shard_grads_) {
    finalize_sharded_grads();
    return;
  }
  if (distributed_ && all_reduce_grads_) {
    // Megatron-FSDP's optim strategy: every rank sums every gradient, then updates its shard.
    if (buckets_) buckets_->finish();
    sum_tensor_parallel_partials(main_grads_.narrow(0, 0, numel_), 0);
    sum_embedding_copies();
    if (!buckets_ && dp_size() > 1) groups_.dp->all_reduce(main_grads_);
    take_own_grad_shard();
    return;
  }
  if (buckets_) {
    // Overlapped data-parallel reductions must land before anything else touches the buffer. The
    // other groups' sums commute with the data-parallel average; with the distributed optimizer
    // the embedding copies are summed first (their buckets wait for it, see enable_grad_overlap).
    if (distributed_) {
      buckets_->finish([this] { sum_embedding_copies(); });
      sum_tensor_parallel_partials(main_grads_.narrow(0, shard_begin_, shard_numel_), shard_begin_);
      take_own_grad_shard();
    } else {
      buckets_->finish();
      sum_tensor_parallel_partials(main_grads_.narrow(0, 0, numel_), 0);
      sum_embedding_copies();
    }
    return;
  }
  sum_tensor_parallel_partials(main_grads_.narrow(0, 0, numel_), 0);
  sum_embedding_copies();
  // The data-parallel mean is a sum here: backward already scaled each micro-batch's loss by
  // 1 / (micro-batches x data-parallel ranks) (trainer.cpp, train_step). For experts the sum over
  // the expert data-parallel group then gives Megatron's expert gradient (1/|DP| x the sum over
  // expert-DP replicas: an expert already holds every expert-parallel rank's tokens).
  if (dp_size() == 1) return;
  if (distributed_) {
    // Over this rank's optimizer instance, then (several instances) over the owners of the same
    // shard in the others, in the gradients' dtype as Megatron's buckets.
    auto shard = main_grads_.scalar_type() == torch::kFloat32 ? grad_shard_ : torch::empty({shard_numel_}, main_grads_.options());
    groups_.shard->reduce_scatter(shard, main_grads_);
    if (groups_.instances->size() > 1) groups_.instances->all_reduce(shard);
    if (!shard.is_same(grad_shard_)) grad_shard_.copy_(shard);
  } else {
    groups_.dp->all_reduce(main_grads_);
  }
}

// Sharded gradients: the units still holding gradients reduced, the tied embedding's pipeline
// copies summed first (their units keep their gradients whole), then the tensor-parallel partial
// sums over this rank's shard, as the overlapped distributed optimizer does them.
void OptimizerDomain::finalize_sharded_grads() {
  FP8TRON_CHECK(sharded_grads_ != nullptr, "sharded gradients need shard_model_params()");
  sharded_grads_->finish([this] {
    for (const auto& p : buffer_order_) {
      if (!summed_over_stages(p)) continue;
      torch::Tensor g = p.tensor.mutable_grad();
      groups_.embedding->all_reduce(g);
    }
  });
  sum_tensor_parallel_partials(grad_shard_, shard_begin_);
}

void OptimizerDomain::take_own_grad_shard() {
  const auto own = main_grads_.narrow(0, shard_begin_, shard_numel_);
  if (grad_shard_.data_ptr() != own.data_ptr()) grad_shard_.copy_(own);
}

void OptimizerDomain::all_reduce_model_groups(torch::Tensor& value) {
  // Tensor-parallel ranks hold different shards, pipeline stages (and expert-parallel ranks)
  // different layers (experts), and with the distributed optimizer data-parallel ranks different
  // parts of the buffer (the ranks of one instance: every instance holds the whole buffer).
  for (const auto& group : groups_.model_parallel)
    if (group->size() > 1) group->all_reduce(value);
  if (distributed_) groups_.shard->all_reduce(value);
}

namespace {
// On GPUs dot products (fp32 accumulation, no [numel] temporary of squares) over chunks below
// cuBLAS's 2^31-element limit; the CPU path keeps the elementwise squares.
torch::Tensor sum_of_squares(const torch::Tensor& v) {
  if (!v.is_cuda()) return v.pow(2).sum();
  constexpr int64_t kChunk = int64_t{1} << 30;
  torch::Tensor total;
  for (int64_t at = 0; at < v.numel(); at += kChunk) {
    const auto c = v.narrow(0, at, std::min(kChunk, v.numel() - at));
    total = total.defined() ? total + at::dot(c, c) : at::dot(c, c);
  }
  return total.defined() ? total : torch::zeros({}, v.options());
}
}  // namespace

torch::Tensor OptimizerDomain::global_norm_squared(const torch::Tensor& buffer, int64_t base) {
  auto total = torch::zeros({}, buffer.options().dtype(torch::kFloat32));
  const int64_t end = base + buffer.numel();
  for (const auto& s : segments_) {
    const int64_t lo = std::max(s.offset, base), hi = std::min(s.offset + s.numel, end);
    if (hi <= lo || s.norm_weight == 0.0) continue;
    auto part = buffer.narrow(0, lo - base, hi - lo).to(torch::kFloat32);
    total += s.norm_weight * sum_of_squares(part);
  }
  all_reduce_model_groups(total);
  return total;
}

torch::Tensor OptimizerDomain::unscaled_grads(const torch::Tensor& divisor) {
  torch::NoGradGuard no_grad;
  // The gradients this rank updates with, in fp32, laid out from shard_begin_.
  torch::Tensor grads = distributed_            ? grad_shard_
                        : grad_shard_.defined() ? grad_shard_.copy_(main_grads_)
                                                : main_grads_.narrow(0, 0, numel_);
  if (divisor.defined()) grads.div_(divisor);
  return grads;
}

std::optional<std::string> OptimizerDomain::first_nonfinite_grad() const {
  torch::NoGradGuard no_grad;
  // The gradients step() used, laid out from `base` as unscaled_grads() returns them (the step
  // clips them in place; clipping by a non-finite norm multiplies by 0, which keeps NaN and inf).
  const torch::Tensor grads = grad_shard_.defined() ? grad_shard_ : main_grads_.narrow(0, 0, numel_);
  const int64_t base = distributed_ ? shard_begin_ : 0;
  std::optional<std::pair<int64_t, std::string>> first;  // (model order, name)
  for (size_t i = 0; i < slots_.size(); ++i) {
    const int64_t lo = std::max(slots_[i].offset, base), hi = std::min(slots_[i].offset + slots_[i].numel, base + grads.numel());
    if (lo >= hi || (first && first->first < buffer_order_[i].first_use)) continue;
    if (!torch::isfinite(grads.narrow(0, lo - base, hi - lo)).all().item<bool>())
      first = std::make_pair(buffer_order_[i].first_use, slots_[i].name);
  }
  if (!first) return std::nullopt;
  return first->second;
}

torch::Tensor OptimizerDomain::norm_squared(const torch::Tensor& grads) { return global_norm_squared(grads, shard_begin_); }

bool OptimizerDomain::folds_clipping(const torch::Tensor& grads) const {
  return grads.is_cuda() && config_.optimizer == "adam";
}

void OptimizerDomain::update(const torch::Tensor& grads, double lr, double weight_decay, const torch::Tensor& found_inf,
                             const torch::Tensor& clip_coeff, const GroupLrs& group_lrs) {
  torch::NoGradGuard no_grad;
  FP8TRON_CHECK(!clip_coeff.defined() || folds_clipping(grads), "update: clipping is folded only into fused Adam on GPUs");
  // The fused kernel divides each gradient by grad_scale as it reads it.
  const std::optional<torch::Tensor> grad_divisor =
      clip_coeff.defined() ? std::optional<torch::Tensor>(clip_coeff.reciprocal()) : std::nullopt;
  // Nothing may still read this rank's shard of the model parameters: the step may write it.
  if (param_gather_) param_gather_->finish();
  // A skipped step does not advance bias correction. Every Adam segment this rank updates counts
  // the step once, before any part of it is updated.
  const int64_t shard_end = std::min(shard_begin_ + shard_numel_, numel_);
  if (config_.optimizer == "adam" || config_.optimizer == "muon") {
    auto keep = 1.0 - found_inf;
    for (size_t i = 0; i < segments_.size(); ++i) {
      const Segment& s = segments_[i];
      if (!s.muon && std::max(s.offset, shard_begin_) < std::min(s.offset + s.numel, shard_end)) step_counts_[i].add_(keep);
    }
  }
  if (!first_chunk_ranges_.empty()) {
    update_first_chunk_first(grads, lr, weight_decay, found_inf, grad_divisor, group_lrs);
    return;
  }
  Ranges published;  // model parameters the fused Adam kernel wrote
  update_ranges(UpdatePart::kAll, grads, lr, weight_decay, found_inf, grad_divisor, group_lrs, published);
  if (param_gather_) {
    copy_main_to_model(published);
    if (codes_.defined()) encode_own_shard();
    param_gather_->start();
  } else {
    publish_model_params(published);
  }
}

// Megatron's ChainedOptimizer under --overlap-param-gather-with-optimizer-step: the first model
// chunk's optimizer steps, its parameters' all-gather is dispatched, then the other chunks'
// optimizer steps. Every element is updated once, as without the flag.
void OptimizerDomain::update_first_chunk_first(const torch::Tensor& grads, double lr, double weight_decay,
                                               const torch::Tensor& found_inf,
                                               const std::optional<torch::Tensor>& grad_divisor,
                                               const GroupLrs& group_lrs) {
  Ranges published;
  update_ranges(UpdatePart::kFirstChunk, grads, lr, weight_decay, found_inf, grad_divisor, group_lrs, published);
  copy_main_to_model(published, first_chunk_ranges_);
  param_gather_->start_first_chunk();
  gathers_during_step_ += param_gather_->buckets_in_flight();
  published.clear();
  update_ranges(UpdatePart::kOtherChunks, grads, lr, weight_decay, found_inf, grad_divisor, group_lrs, published);
  copy_main_to_model(published, other_chunk_ranges_);
  param_gather_->start_other_chunks();
}

namespace {
// The ranges a step of the first model chunk updates inside [lo, hi), this rank's part of a
// segment: the chunk's ranges there, widened to multiples of kUpdateGranule elements from lo.
// ATen's CPU fused Adam runs SIMD vectors over its range from the start (split among threads at
// multiples of a 64-byte cache line) and a scalar loop, which rounds differently (FMA), over the
// tail; cutting a segment only at multiples of 64 elements from its start (or at its end) keeps
// every element on the path it takes in one call over the whole part, so the run stays bitwise.
// The few other-chunk elements updated early are gathered with their own buckets, after the step.
constexpr int64_t kUpdateGranule = 64;
std::vector<std::pair<int64_t, int64_t>> first_chunk_pieces(const std::vector<std::pair<int64_t, int64_t>>& first,
                                                            int64_t lo, int64_t hi) {
  std::vector<std::pair<int64_t, int64_t>> pieces;  // (offset, numel)
  for (auto [offset, numel] : first) {
    int64_t a = std::max(offset, lo), b = std::min(offset + numel, hi);
    if (b <= a) continue;
    a = lo + (a - lo) / kUpdateGranule * kUpdateGranule;
    b = std::min(hi, lo + (b - lo + kUpdateGranule - 1) / kUpdateGranule * kUpdateGranule);
    if (!pieces.empty() && pieces.back().first + pieces.back().second >= a)
      pieces.back().second = std::max(pieces.back().first + pieces.back().second, b) - pieces.back().first;
    else
      pieces.emplace_back(a, b - a);
  }
  return pieces;
}
}  // namespace

void OptimizerDomain::update_ranges(UpdatePart part, const torch::Tensor& grads, double lr, double weight_decay,
                                    const torch::Tensor& found_inf, const std::optional<torch::Tensor>& grad_divisor,
                                    const GroupLrs& group_lrs, Ranges& published) {
  const int64_t shard_end = std::min(shard_begin_ + shard_numel_, numel_);
  auto keep = 1.0 - found_inf;
  for (size_t i = 0; i < segments_.size(); ++i) {
    const auto& s = segments_[i];
    const int64_t lo = std::max(s.offset, shard_begin_), hi = std::min(s.offset + s.numel, shard_end);
    if (hi <= lo) continue;
    const double wd = s.decay ? weight_decay : 0.0;
    const double group_lr = s.lr_group == LrGroup::Decoupled ? group_lrs.decoupled.value_or(lr)
                            : s.lr_group == LrGroup::Mup     ? group_lrs.mup.value_or(lr)
                                                             : lr;
    if (s.muon) {
      FP8TRON_CHECK(part == UpdatePart::kAll, "Muon updates whole segments");
      muon_step(s, grads, group_lr, wd, found_inf);
      continue;
    }
    Ranges pieces{{lo, hi - lo}};
    if (part != UpdatePart::kAll) {
      const Ranges first = first_chunk_pieces(first_chunk_ranges_, lo, hi);
      if (part == UpdatePart::kFirstChunk) {
        pieces = first;
      } else {  // the rest of [lo, hi)
        pieces.clear();
        int64_t at = lo;
        for (auto [offset, numel] : first) {
          if (offset > at) pieces.emplace_back(at, offset - at);
          at = offset + numel;
        }
        if (at < hi) pieces.emplace_back(at, hi - at);
      }
    }
    for (auto [a, n] : pieces) {
      const int64_t off = a - shard_begin_;
      if (config_.optimizer == "adam" || config_.optimizer == "muon") {
        if (adam_step(i, a, n, grads, group_lr, wd, config_.adam_eps * s.eps_mult, found_inf, grad_divisor))
          published.emplace_back(a, n);
      } else {
        // SGD with momentum (torch.optim.SGD semantics); skipped steps leave everything unchanged.
        auto p = main_params_.narrow(0, off, n), g = grads.narrow(0, off, n), m = exp_avg_.narrow(0, off, n);
        auto d = torch::nan_to_num(g, 0.0, 0.0, 0.0) + wd * p;
        m.mul_(config_.sgd_momentum * keep + found_inf).add_(d * keep);
        p.sub_(m * (group_lr * keep));
      }
    }
  }
}

bool OptimizerDomain::adam_step(size_t segment, int64_t lo, int64_t n, const torch::Tensor& grads, double lr, double wd,
                                double eps, const torch::Tensor& found_inf, const std::optional<torch::Tensor>& grad_divisor) {
  if (scaled_exp_avg_ || scaled_exp_avg_sq_ || scaled_main_)
    return scaled_adam_step(segment, lo, n, grads, lr, wd, eps, found_inf, grad_divisor);
  const int64_t off = lo - shard_begin_;
  AdamWState state{main_params_.narrow(0, off, n), grads.narrow(0, off, n), exp_avg_.narrow(0, off, n),
                   exp_avg_sq_.narrow(0, off, n), {}};
  // The model parameters, when they are a buffer of their own published as values (not as bytes:
  // --fp8-param-gather encodes its range from the main weights after the step), in the same pass.
  if (separate_main_weights_ && !codes_.defined()) state.model_copy = model_params_.narrow(0, lo - model_base_, n);
  const torch::Tensor& step = step_counts_[segment];
  if (!torch_adam_kernel_ && fused_adamw_applies(state, step, found_inf, grad_divisor)) {
    fused_adamw(state, step, found_inf, grad_divisor, {lr, config_.adam_beta1, config_.adam_beta2, eps, wd});
    return state.model_copy.defined();
  }
  if (state.exp_avg.scalar_type() == torch::kFloat32 && state.exp_avg_sq.scalar_type() == torch::kFloat32) {
    at::_fused_adamw_({state.param}, {state.grad}, {state.exp_avg}, {state.exp_avg_sq}, {}, {step}, lr, config_.adam_beta1,
                      config_.adam_beta2, wd, eps, false, false, grad_divisor, found_inf);
    return false;
  }
  // Low-precision moments (the CPU, or a GPU path the fused kernel does not take): as Transformer
  // Engine's FusedAdam does for them, widen to fp32 (exactly), step in fp32, store rounded to
  // nearest-even; in chunks, so the fp32 copies stay small. Bitwise the fused kernel's bf16 path.
  constexpr int64_t kChunk = int64_t{1} << 22;
  for (int64_t begin = 0; begin < n; begin += kChunk) {
    const int64_t len = std::min(kChunk, n - begin);
    auto m = state.exp_avg.narrow(0, begin, len), v = state.exp_avg_sq.narrow(0, begin, len);
    auto m32 = m.to(torch::kFloat32), v32 = v.to(torch::kFloat32);
    at::_fused_adamw_({state.param.narrow(0, begin, len)}, {state.grad.narrow(0, begin, len)}, {m32}, {v32}, {}, {step}, lr,
                      config_.adam_beta1, config_.adam_beta2, wd, eps, false, false, grad_divisor, found_inf);
    m.copy_(m32);
    v.copy_(v32);
  }
  return false;
}

bool OptimizerDomain::scaled_adam_step(size_t segment, int64_t lo, int64_t n, const torch::Tensor& grads, double lr,
                                       double wd, double eps, const torch::Tensor& found_inf,
                                       const std::optional<torch::Tensor>& grad_divisor) {
  // Every scaled state has the same pieces (state_pieces()).
  const ScaledState& any = scaled_main_ ? *scaled_main_ : scaled_exp_avg_ ? *scaled_exp_avg_ : *scaled_exp_avg_sq_;
  const auto& pieces = any.pieces();
  const int64_t off = lo - shard_begin_, end = off + n;
  // The pieces overlapping [off, end), each of which must lie inside it.
  size_t first = size_t(std::upper_bound(pieces.begin(), pieces.end(), off,
                                         [](int64_t at, const std::pair<int64_t, int64_t>& p) { return at < p.first + p.second; }) -
                        pieces.begin());
  size_t last = first;
  while (last < pieces.size() && pieces[last].first < end) {
    FP8TRON_CHECK(pieces[last].first >= off && pieces[last].first + pieces[last].second <= end,
                  "states scaled per parameter are updated one whole parameter at a time");
    ++last;
  }
  if (first == last) return false;
  const bool cuda = any.stored().is_cuda();
  // On GPUs the fused kernel (two passes over the elements, no fp32 copies) writes the model
  // parameters too; the torch operations below give the same bits.
  if (cuda && !torch_adam_kernel_) {
    fused_scaled_adam_step(segment, first, last, grads, lr, wd, eps, found_inf, grad_divisor);
    return separate_main_weights_ && !codes_.defined();
  }
  // Parameters are read and stored in groups of adjacent ones (a few device operations a group,
  // not a few per parameter), of at most 4M elements unless one parameter alone is larger, so the
  // fp32 copies stay small on GPUs. Adam runs once per group on GPUs; on CPUs once over the whole
  // range, because ATen's CPU fused Adam rounds an element by where it lies in the call (SIMD body
  // or scalar tail), and one call over the range rounds each element as the fp32 optimizer's call
  // over the same range does. (On GPUs it is elementwise: the same bits either way.)
  constexpr int64_t kGroupElements = int64_t{1} << 22;
  const std::vector<ScaledState::Group> groups = any.groups(first, last, kGroupElements);
  auto step = [&](size_t g0, size_t g1) {  // groups [g0, g1)
    const int64_t a = any.begin(groups[g0]), len = any.begin(groups[g1 - 1]) + any.numel(groups[g1 - 1]) - a;
    auto widened = [&](const std::unique_ptr<ScaledState>& scaled, const torch::Tensor& stored) {
      if (!scaled) return stored.narrow(0, a, len).to(torch::kFloat32);
      if (g1 == g0 + 1) return scaled->unscaled(groups[g0]);
      auto values = torch::zeros({len}, state_options());  // zeros between groups (padding)
      for (size_t k = g0; k < g1; ++k)
        values.narrow(0, scaled->begin(groups[k]) - a, scaled->numel(groups[k])).copy_(scaled->unscaled(groups[k]));
      return values;
    };
    torch::Tensor m = widened(scaled_exp_avg_, exp_avg_), v = widened(scaled_exp_avg_sq_, exp_avg_sq_);
    torch::Tensor p = widened(scaled_main_, main_params_);  // fp32 main weights: a copy, stored back below
    at::_fused_adamw_({p}, {grads.narrow(0, a, len)}, {m}, {v}, {}, {step_counts_[segment]}, lr, config_.adam_beta1,
                      config_.adam_beta2, wd, eps, false, false, grad_divisor, found_inf);
    // A skipped step (found_inf) leaves the stored states as they were, as Megatron skips the step.
    auto store = [&](const std::unique_ptr<ScaledState>& scaled, const torch::Tensor& stored, const torch::Tensor& values) {
      if (!scaled) {
        torch::Tensor target = stored.narrow(0, a, len);
        if (target.data_ptr() != values.data_ptr()) target.copy_(values);
        return;
      }
      for (size_t k = g0; k < g1; ++k)
        scaled->store(groups[k], values.narrow(0, scaled->begin(groups[k]) - a, scaled->numel(groups[k])), found_inf);
    };
    store(scaled_exp_avg_, exp_avg_, m);
    store(scaled_exp_avg_sq_, exp_avg_sq_, v);
    if (!scaled_main_) return;
    // The model weights from the fp32 values, before these are rounded to fp16 (TE's FusedAdam
    // writes them in its Adam kernel); a skipped step leaves them too.
    torch::Tensor model = model_params_.narrow(0, shard_begin_ + a - model_base_, len);
    torch::Tensor updated = p.to(model.scalar_type());
    model.copy_(torch::where(found_inf.to(model.device()) != 0, model, updated));
    store(scaled_main_, main_params_, p);
  };
  if (!cuda) {
    step(0, groups.size());
  } else {
    for (size_t k = 0; k < groups.size(); ++k) step(k, k + 1);
  }
  return scaled_main_ != nullptr;
}

void OptimizerDomain::fused_scaled_adam_step(size_t segment, size_t first, size_t last, const torch::Tensor& grads,
                                             double lr, double wd, double eps, const torch::Tensor& found_inf,
                                             const std::optional<torch::Tensor>& grad_divisor) {
  const ScaledState& any = scaled_main_ ? *scaled_main_ : scaled_exp_avg_ ? *scaled_exp_avg_ : *scaled_exp_avg_sq_;
  const c10::cuda::CUDAGuard guard(any.stored().device());
  const torch::Tensor& chunks = any.kernel_chunks(first, last);
  // The model copy's element of this rank's first main-weight element: the same indexing.
  torch::Tensor model;
  if (separate_main_weights_ && !codes_.defined()) model = model_params_.narrow(0, shard_begin_ - model_base_, shard_numel_);
  const auto copy_type = copy_type_of(model);
  FP8TRON_CHECK(copy_type.has_value(), "the fused step writes bf16, fp16 or fp32 model copies");
  // A state scaled per parameter, or a plain fp32 / bf16 buffer.
  auto buffers = [&](const std::unique_ptr<ScaledState>& scaled, const torch::Tensor& plain) -> kernels::StateBuffers {
    if (scaled) return scaled->kernel_buffers(first, last);
    FP8TRON_CHECK(plain.scalar_type() == torch::kFloat32 || plain.scalar_type() == torch::kBFloat16,
                  "unscaled optimizer states are fp32 or bf16");
    const auto type = plain.scalar_type() == torch::kFloat32 ? kernels::StateType::kFloat32 : kernels::StateType::kBFloat16;
    return {plain.data_ptr(), type, nullptr, nullptr, nullptr};
  };
  const kernels::ScaledAdamWStep step{grads.data_ptr<float>(),
                                      buffers(scaled_main_, main_params_),
                                      buffers(scaled_exp_avg_, exp_avg_),
                                      buffers(scaled_exp_avg_sq_, exp_avg_sq_),
                                      model.defined() ? model.data_ptr() : nullptr,
                                      *copy_type,
                                      reinterpret_cast<const kernels::ScaledChunk*>(chunks.data_ptr<int64_t>()),
                                      chunks.size(0),
                                      int64_t(first),
                                      int64_t(last - first)};
  const kernels::AdamWDeviceScalars scalars{step_counts_[segment].data_ptr<float>(), found_inf.data_ptr<float>(),
                                            grad_divisor ? grad_divisor->data_ptr<float>() : nullptr};
  kernels::scaled_fused_adamw(step, scalars, {lr, config_.adam_beta1, config_.adam_beta2, eps, wd},
                              c10::cuda::getCurrentCUDAStream(any.stored().device().index()).stream());
}

// Muon (Emerging-Optimizers' OrthogonalizedOptimizer.step with Megatron's TensorParallelMuon):
// decoupled weight decay p <- p (1 - lr wd), momentum m <- m + (1 - beta)(g - m), direction m (or
// Nesterov's g + beta (m - g)), p <- p - lr x scaled Newton-Schulz(direction). A skipped step
// (inf/nan gradients) leaves p and m unchanged without waiting for the device. The domain's
// tensor-parallel group gathers the shards (expert tensor parallelism for the experts). With the
// distributed optimizer a rank updates the matrices its shard holds, each whole (the layout puts
// every Muon matrix inside one shard); its tensor-parallel peers hold the same matrices' other
// shards in the same place of the same layout, so they join the same gathers in the same order.
void OptimizerDomain::muon_step(const Segment& s, const torch::Tensor& grads, double lr, double wd,
                                const torch::Tensor& found_inf) {
  const MuonConfig& c = config_.muon;
  auto keep = 1.0 - found_inf;
  for (const auto& slot : muon_slots_) {
    if (slot.offset < s.offset || slot.offset >= s.offset + s.numel) continue;
    if (slot.offset < shard_begin_ || slot.offset >= shard_begin_ + shard_numel_) continue;  // another rank's
    int64_t n = 1;
    for (int64_t d : slot.shape) n *= d;
    FP8TRON_CHECK(slot.offset + n <= shard_begin_ + shard_numel_, "a Muon matrix crosses a distributed-optimizer shard");
    const int64_t at = slot.offset - shard_begin_;  // the optimizer's buffers start at shard_begin_
    auto p = main_params_.narrow(0, at, n).view(slot.shape);
    auto g = torch::nan_to_num(grads.narrow(0, at, n), 0.0, 0.0, 0.0).view(slot.shape);
    auto m = exp_avg_.narrow(0, at, n).view(slot.shape);
    auto m_new = m + (1.0 - c.momentum) * (g - m);
    auto direction = c.nesterov ? g + c.momentum * (m_new - g) : m_new;
    auto update = muon_update(direction, slot.param, c, *groups_.tp);
    m.copy_(keep * m_new + found_inf * m);
    p.copy_(keep * (p * (1.0 - lr * wd) - lr * update) + found_inf * p);
  }
}

void OptimizerDomain::set_qkv_rows(const std::vector<int64_t>& rows) {
  for (auto& slot : muon_slots_)
    if (slot.param.qkv) slot.param.qkv_rows = rows;
}

torch::Tensor OptimizerDomain::zeros_in(const torch::Tensor& grads) {
  // Tensor-parallel duplicates count on rank 0 of their group only; the tied embedding's copy not at all.
  auto total = torch::zeros({}, grads.options().dtype(torch::kFloat64));
  const int64_t end = shard_begin_ + grads.numel();
  for (const auto& s : segments_) {
    const int64_t lo = std::max(s.offset, shard_begin_), hi = std::min(std::min(s.offset + s.numel, end), numel_);
    if (hi <= lo || s.norm_weight == 0.0 || (s.norm_weight < 1.0 && groups_.tp->rank() != 0)) continue;
    total += (grads.narrow(0, lo - shard_begin_, hi - lo) == 0).sum().to(torch::kFloat64);
  }
  all_reduce_model_groups(total);
  return total;
}

void OptimizerDomain::copy_main_to_model(const Ranges& published) { copy_main_to_model(published, {{0, padded_numel_}}); }

void OptimizerDomain::copy_main_to_model(const Ranges& published, const Ranges& within) {
  // This rank's elements: its shard, or the whole buffer without the distributed optimizer.
  const int64_t end = distributed_ ? shard_begin_ + shard_numel_ : numel_;
  auto copy = [&](int64_t lo, int64_t hi) {
    if (hi <= lo) return;
    const torch::Tensor main = scaled_main_ ? scaled_main_->unscaled_range(lo - shard_begin_, hi - lo)
                                            : main_params_.narrow(0, lo - shard_begin_, hi - lo);
    model_params_.narrow(0, lo - model_base_, hi - lo).copy_(main);
  };
  for (auto [w_offset, w_numel] : within) {
    int64_t at = std::max(w_offset, shard_begin_);
    const int64_t stop = std::min(w_offset + w_numel, end);
    if (stop <= at) continue;
    for (auto [offset, n] : published) {
      if (offset + n <= at || offset >= stop) continue;
      copy(at, offset);
      at = std::max(at, offset + n);
    }
    copy(at, stop);
  }
}

void OptimizerDomain::publish_model_params() { publish_model_params(Ranges{}); }

void OptimizerDomain::publish_model_params(const Ranges& published) {
  torch::NoGradGuard no_grad;
  // A load that read the model weights (model_shard_to_load) leaves them as read.
  const bool loaded = std::exchange(model_shard_loaded_, false);
  if (sharded_) {
    // The units hold the old values: they gather the new ones from the shards when next used.
    sharded_->release_all();
    if (!loaded) copy_main_to_model(published);
    if (codes_.defined()) {
      encode_own_shard();
      sharded_->publish_bytes(codes_, byte_publish_.decode);
    }
    return;
  }
  finish_param_gather();
  if (codes_.defined()) {
    if (distributed_) model_params_.narrow(0, shard_begin_, shard_numel_).copy_(main_params_);
    encode_own_shard();
    gather_and_decode();
    return;
  }
  if (distributed_) {
    if (!loaded) copy_main_to_model(published);
    auto mine = model_params_.narrow(0, shard_begin_, shard_numel_);
    auto gathered = model_params_;
    groups_.shard->all_gather(gathered, mine.clone());
  } else if (separate_main_weights_ && !loaded) {
    copy_main_to_model(published);
  }
}

double OptimizerDomain::step_count() const {
  double steps = 0;
  for (const auto& s : step_counts_) steps = std::max(steps, s.item<double>());
  return steps;
}

void OptimizerDomain::set_step_count(double steps) {
  for (auto& s : step_counts_) s.fill_(steps);
}

torch::Tensor OptimizerDomain::params_norm_squared() {
  torch::NoGradGuard no_grad;
  return global_norm_squared(main_values(), shard_begin_);
}

}  // namespace fp8tron
