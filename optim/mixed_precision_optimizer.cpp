#include "optim/mixed_precision_optimizer.h"

#include "core/error.h"

namespace fp8tron {

DomainGroups dense_domain_groups(const ParallelState& p, const OptimizerInstanceGroups& instances) {
  DomainGroups g;
  g.name = "dense";
  g.dp = p.dp;
  g.shard = instances.intra;
  g.instances = instances.inter;
  g.tp = p.tp;
  g.model_parallel = {p.tp, p.pp};
  g.embedding = p.embedding;
  return g;
}

DomainGroups expert_domain_groups(const ParallelState& p, const OptimizerInstanceGroups& instances) {
  DomainGroups g;
  g.name = "expert";
  g.dp = p.expert_dp;
  g.shard = instances.intra;
  g.instances = instances.inter;
  g.tp = p.expert_tp;
  // Expert tensor-parallel ranks hold different shards, expert-parallel ranks different experts.
  g.model_parallel = {p.expert_tp_ep, p.pp};
  return g;
}

MixedPrecisionOptimizer::MixedPrecisionOptimizer(const std::vector<NamedParam>& params, const OptimizerConfig& optimizer,
                                                 const PrecisionConfig& precision, const ParallelState& parallel,
                                                 bool distributed, bool expert_domain,
                                                 const std::vector<torch::Tensor>& byte_params,
                                                 const DataParallelInstances& instances, bool shard_grads)
    : clip_grad_(optimizer.clip_grad) {
  FP8TRON_CHECK(!params.empty(), "no parameters");
  std::vector<NamedParam> dense, experts;
  for (const auto& p : params) (p.info.expert ? experts : dense).push_back(p);
  for (size_t i = 0; i < params.size(); ++i) model_order_.emplace(params[i].name, int64_t(i));
  FP8TRON_CHECK(!dense.empty(), "no dense parameters");
  FP8TRON_CHECK(expert_domain || experts.empty(), "expert parameters in a model without an expert domain");
  const auto device = dense.front().tensor.device();
  std::vector<torch::Tensor> dense_bytes, expert_bytes;
  for (const auto& b : byte_params) {
    bool expert = false;
    for (const auto& p : experts) expert = expert || b.is_same(p.tensor);
    (expert ? expert_bytes : dense_bytes).push_back(b);
  }
  domains_.push_back(std::make_unique<OptimizerDomain>(
      dense, optimizer, precision, dense_domain_groups(parallel, instances.dense), distributed, device, dense_bytes,
      shard_grads));
  if (expert_domain)
    domains_.push_back(std::make_unique<OptimizerDomain>(experts, optimizer, precision,
                                                         expert_domain_groups(parallel, instances.expert), distributed,
                                                         device, expert_bytes, shard_grads));
}

void MixedPrecisionOptimizer::enable_byte_publish(const std::function<BytePublish(const OptimizerDomain&)>& publish) {
  for (auto& d : domains_)
    if (d->byte_numel() > 0) d->enable_byte_publish(publish(*d));
}

bool MixedPrecisionOptimizer::byte_published() const {
  for (const auto& d : domains_)
    if (d->byte_published()) return true;
  return false;
}

void MixedPrecisionOptimizer::zero_grad() {
  for (auto& d : domains_) d->zero_grad();
}
void MixedPrecisionOptimizer::skip_zeroing(const std::vector<torch::Tensor>& params) {
  for (const auto& p : params) {
    bool held = false;
    for (auto& d : domains_) held = held || d->holds(p);
    FP8TRON_CHECK(held, "skip_zeroing: not a main-gradient view");
  }
  for (auto& d : domains_) d->skip_zeroing(params);
}
void MixedPrecisionOptimizer::finalize_grads() {
  for (auto& d : domains_) d->finalize_grads();
}
void MixedPrecisionOptimizer::enable_grad_overlap(int64_t bucket_numel) {
  for (auto& d : domains_) d->enable_grad_overlap(bucket_numel);
}
void MixedPrecisionOptimizer::arm_grad_overlap() {
  for (auto& d : domains_) d->arm_grad_overlap();
}
void MixedPrecisionOptimizer::complete_grads_later(const std::vector<torch::Tensor>& params) {
  for (auto& d : domains_) d->complete_grads_later(params);
}
void MixedPrecisionOptimizer::grad_done(const void* param) {
  for (auto& d : domains_) d->grad_done(param);
}
void MixedPrecisionOptimizer::allocate_grad_of(const torch::Tensor& param) {
  for (auto& d : domains_) d->allocate_grad_of(param);
}
void MixedPrecisionOptimizer::enable_param_gather_overlap(int64_t bucket_numel, bool with_optimizer_step) {
  for (auto& d : domains_) d->enable_param_gather_overlap(bucket_numel, with_optimizer_step);
}
int64_t MixedPrecisionOptimizer::param_gathers_during_step() const {
  int64_t n = 0;
  for (const auto& d : domains_) n += d->param_gathers_during_step();
  return n;
}
void MixedPrecisionOptimizer::wait_for_params(const torch::nn::Module& module) {
  for (auto& d : domains_) d->wait_for_params(module);
}
void MixedPrecisionOptimizer::finish_param_gather() {
  for (auto& d : domains_) d->finish_param_gather();
}
void MixedPrecisionOptimizer::shard_model_params(const std::vector<std::vector<torch::Tensor>>& units, GatherPolicy policy) {
  for (auto& d : domains_) d->shard_model_params(units, policy);
}
void MixedPrecisionOptimizer::release_params(const torch::nn::Module& module, const std::vector<torch::Tensor>& outputs) {
  for (auto& d : domains_) d->release_params(module, outputs);
}
void MixedPrecisionOptimizer::gather_all_params() {
  for (auto& d : domains_) d->gather_all_params();
}
void MixedPrecisionOptimizer::release_all_params() {
  for (auto& d : domains_) d->release_all_params();
}
void MixedPrecisionOptimizer::all_reduce_sharded_grads() {
  for (auto& d : domains_) d->all_reduce_sharded_grads();
}
bool MixedPrecisionOptimizer::params_sharded() const {
  for (const auto& d : domains_)
    if (d->params_sharded()) return true;
  return false;
}
ShardedWeightBytes MixedPrecisionOptimizer::sharded_weight_bytes() const {
  ShardedWeightBytes bytes;
  for (const auto& d : domains_) {
    const ShardedWeights* w = d->sharded_weights();
    if (!w) continue;
    bytes.resident += w->resident_bytes();
    bytes.peak += w->peak_resident_bytes();
    bytes.total += w->total_bytes();
    bytes.shard += d->model_params().numel() * int64_t(d->model_params().element_size());
    if (const ShardedGrads* g = d->sharded_grads()) {
      bytes.grad_resident += g->resident_bytes();
      bytes.grad_peak += g->peak_resident_bytes();
      bytes.grad_total += g->total_bytes();
      bytes.grad_shard += d->shard_numel() * int64_t(sizeof(float));
    }
  }
  return bytes;
}
bool MixedPrecisionOptimizer::param_gather_overlapped() const {
  for (const auto& d : domains_)
    if (d->param_gather_overlapped()) return true;
  return false;
}

StepResult MixedPrecisionOptimizer::step(double lr, double weight_decay, double loss_scale, const GroupLrs& group_lrs) {
  const auto& reference = domains_.front()->main_grads();
  auto divisor = loss_scale == 1.0 ? torch::Tensor() : torch::full({}, loss_scale, reference.options().dtype(torch::kFloat32));
  return step(lr, weight_decay, divisor, group_lrs);
}

StepResult MixedPrecisionOptimizer::step(double lr, double weight_decay, const torch::Tensor& grad_divisor,
                                         const GroupLrs& group_lrs) {
  PreparedStep prepared = prepare_step(grad_divisor);
  return apply_step(prepared, lr, weight_decay, group_lrs);
}

PreparedStep MixedPrecisionOptimizer::prepare_step(const torch::Tensor& grad_divisor) {
  torch::NoGradGuard no_grad;
  PreparedStep p;
  for (auto& d : domains_) p.grads.push_back(d->unscaled_grads(grad_divisor));
  // One norm: each domain's squares summed over its own groups, then added (Megatron:
  // sqrt(dense^2 + expert^2)).
  torch::Tensor squared = domains_[0]->norm_squared(p.grads[0]);
  for (size_t i = 1; i < domains_.size(); ++i) squared = squared + domains_[i]->norm_squared(p.grads[i]);
  p.grad_norm = squared.sqrt();
  return p;
}

StepResult MixedPrecisionOptimizer::apply_step(PreparedStep& p, double lr, double weight_decay,
                                               const GroupLrs& group_lrs, const torch::Tensor& skip) {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor>& grads = p.grads;
  StepResult result;
  result.grad_norm = p.grad_norm;
  result.found_inf = result.grad_norm.isfinite().logical_not().to(torch::kFloat32);
  if (skip.defined()) result.found_inf = torch::maximum(result.found_inf, skip.to(torch::kFloat32));
  torch::Tensor coeff;
  if (clip_grad_ > 0) {
    // Megatron: clip_coeff = max_norm / (total_norm + 1e-6), applied when below 1.
    coeff = torch::nan_to_num((clip_grad_ / (result.grad_norm + 1e-6)).clamp_max(1.0), 0.0, 0.0, 0.0);
  }
  std::vector<bool> folded(domains_.size(), false);
  for (size_t i = 0; i < domains_.size(); ++i) {
    folded[i] = coeff.defined() && domains_[i]->folds_clipping(grads[i]);
    if (coeff.defined() && !folded[i]) grads[i].mul_(coeff);
  }
  // Megatron counts the zeros after clipping; a positive coefficient folded into Adam changes none.
  if (count_zeros_) {
    torch::Tensor zeros = domains_[0]->zeros_in(grads[0]);
    for (size_t i = 1; i < domains_.size(); ++i) zeros = zeros + domains_[i]->zeros_in(grads[i]);
    result.num_zeros = zeros.to(torch::kInt64);
  }
  for (size_t i = 0; i < domains_.size(); ++i)
    domains_[i]->update(grads[i], lr, weight_decay, result.found_inf, folded[i] ? coeff : torch::Tensor(), group_lrs);
  return result;
}

torch::Tensor MixedPrecisionOptimizer::params_norm() {
  torch::Tensor squared = domains_[0]->params_norm_squared();
  for (size_t i = 1; i < domains_.size(); ++i) squared = squared + domains_[i]->params_norm_squared();
  return squared.sqrt();
}

int64_t MixedPrecisionOptimizer::num_parameters() const {
  int64_t n = 0;
  for (const auto& d : domains_) n += d->num_parameters();
  return n;
}

double MixedPrecisionOptimizer::step_count() const { return domains_.front()->step_count(); }

void MixedPrecisionOptimizer::set_step_count(double steps) {
  for (auto& d : domains_) d->set_step_count(steps);
}

void MixedPrecisionOptimizer::adopt_loaded_states() {
  for (auto& d : domains_) d->adopt_loaded_states();
}

void MixedPrecisionOptimizer::publish_model_params() {
  for (auto& d : domains_) d->publish_model_params();
}

std::optional<std::pair<int64_t, std::string>> MixedPrecisionOptimizer::first_nonfinite_grad() const {
  std::optional<std::pair<int64_t, std::string>> first;
  // Each domain's first in its own order (the model's order restricted to the domain), then the
  // earlier of the dense and the expert one in the model's order.
  for (const auto& d : domains_) {
    const std::optional<std::string> name = d->first_nonfinite_grad();
    if (!name) continue;
    const int64_t position = model_order_.at(*name);
    if (!first || position < first->first) first = std::make_pair(position, *name);
  }
  return first;
}

}  // namespace fp8tron
