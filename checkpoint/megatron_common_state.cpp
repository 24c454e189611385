#include "checkpoint/megatron_common_state.h"

#include <cstring>
#include <optional>

#include "checkpoint/megatron/megatron_checkpoint.h"
#include "checkpoint/megatron/torch_save_writer.h"
#include "checkpoint/model_identity.h"
#include "checkpoint/scheduler_state.h"
#include "core/error.h"
#include "optim/loss_scaler.h"
#include "optim/lr_schedule.h"
#include "optim/mixed_precision_optimizer.h"

namespace fp8tron {
namespace mg = checkpoint::megatron;
namespace {

mg::PyRef from_json(const nlohmann::json& j) {
  if (j.is_null()) return mg::py_none();
  if (j.is_boolean()) return mg::py_bool(j.get<bool>());
  if (j.is_number_integer()) return mg::py_int(j.get<int64_t>());
  if (j.is_number()) return mg::py_float(j.get<double>());
  if (j.is_string()) return mg::py_str(j.get<std::string>());
  if (j.is_array()) {
    std::vector<mg::PyRef> items;
    for (const auto& x : j) items.push_back(from_json(x));
    return mg::py_list(std::move(items));
  }
  std::vector<std::pair<std::string, mg::PyRef>> entries;
  for (const auto& [k, v] : j.items()) entries.emplace_back(k, from_json(v));
  return mg::py_dict(std::move(entries));
}

void set(std::vector<std::pair<std::string, mg::PyRef>>& attrs, const std::string& key, mg::PyRef value) {
  for (auto& [k, v] : attrs)
    if (k == key) {
      v = std::move(value);
      return;
    }
  attrs.emplace_back(key, std::move(value));
}

// Megatron's args namespace: the run's arguments, then what Megatron derives or records in it and
// what a resume reads from it (check_checkpoint_args, the consumed samples, the layout).
mg::PyRef args_namespace(const TrainingState& s) {
  const Config& c = s.config;
  const ModelConfig& m = c.model;
  std::vector<std::pair<std::string, mg::PyRef>> attrs;
  if (s.megatron)
    for (const auto& [k, v] : s.megatron->arguments.items()) attrs.emplace_back(k, from_json(v));
  for (const auto& [key, value] : std::initializer_list<std::pair<const char*, int64_t>>{
           {"num_layers", m.num_layers}, {"hidden_size", m.hidden_size}, {"ffn_hidden_size", m.ffn_hidden_size},
           {"num_attention_heads", m.num_attention_heads}, {"kv_channels", m.kv_channels},
           {"num_query_groups", m.num_query_groups},
           {"padded_vocab_size", m.padded_vocab_size}, {"max_position_embeddings", m.max_position_embeddings},
           {"tensor_model_parallel_size", c.parallel.tp}, {"pipeline_model_parallel_size", c.parallel.pp},
           {"context_parallel_size", c.parallel.cp}, {"world_size", c.parallel.world_size},
           {"data_parallel_size", c.parallel.dp}, {"consumed_train_samples", s.consumed_train_samples},
           {"consumed_valid_samples", s.consumed_valid_samples},
           {"skipped_train_samples", s.skipped_train_samples ? *s.skipped_train_samples : 0}})
    set(attrs, key, mg::py_int(value));
  // Megatron's store_false of --no-position-embedding (which fp8tron refuses): always true, also
  // with rotary positions, and compared on resume.
  set(attrs, "add_position_embedding", mg::py_bool(true));
  // Megatron's argument names of the model switches whose flags say the opposite.
  set(attrs, "add_bias_linear", mg::py_bool(m.add_bias_linear));
  set(attrs, "add_qkv_bias", mg::py_bool(m.add_qkv_bias));
  set(attrs, "group_query_attention", mg::py_bool(m.num_query_groups != m.num_attention_heads));
  set(attrs, "untie_embeddings_and_output_weights", mg::py_bool(m.untie_embeddings_and_output_weights));
  const ParamDtype dtype = c.precision.params_dtype;
  set(attrs, "params_dtype", mg::py_global("torch", dtype == ParamDtype::Bf16   ? "bfloat16"
                                                    : dtype == ParamDtype::Fp16 ? "float16"
                                                                                : "float32"));
  set(attrs, "ckpt_format", mg::py_str("torch_dist"));
  set(attrs, "use_dist_ckpt", mg::py_bool(true));
  // fp8tron's random streams are not Python's, NumPy's and torch's: none is stored, and Megatron
  // skips restoring them when the saving run says it did not save them.
  set(attrs, "no_save_rng", mg::py_bool(true));
  set(attrs, "no_save_optim", c.checkpoint.save_optim ? mg::py_none() : mg::py_bool(true));
  set(attrs, "use_distributed_optimizer", mg::py_bool(c.distributed.distributed_optimizer));
  // The layout the optimizer state is written in (content_metadata below).
  if (c.distributed.distributed_optimizer) set(attrs, "dist_ckpt_optim_fully_reshardable", mg::py_bool(true));
  return mg::py_object(mg::py_global("argparse", "Namespace"), mg::py_dict(std::move(attrs)));
}

// The parameter groups of the dense or the expert parameters' optimizer (megatron_param_groups.h),
// with torch.optim.AdamW's fields (torch.optim.SGD's with --optimizer sgd): each group's defaults,
// then its overrides, its learning rate at this step and its weight decay.
mg::PyRef param_groups(const TrainingState& s, const std::vector<MegatronParamGroup>& groups, bool experts,
                       std::optional<int64_t> step = std::nullopt) {
  const OptimizerConfig& o = s.config.optimizer;
  std::vector<mg::PyRef> out;
  for (const MegatronParamGroup& g : groups) {
    if (g.expert != experts) continue;
    double wd_mult = 1.0, max_lr = s.schedule.config().max_lr, min_lr = s.schedule.config().min_lr, eps = o.adam_eps;
    bool lr_overridden = false;
    for (const auto& [key, value] : megatron_group_overrides(g, o)) {
      if (key == "wd_mult") wd_mult = value;
      if (key == "eps") eps = value;
      if (key == "max_lr") max_lr = value, lr_overridden = true;
      if (key == "min_lr") min_lr = value, lr_overridden = true;
    }
    out.push_back(mg::py_dict({
        {"is_expert_parallel", mg::py_bool(experts)}, {"default_config", mg::py_bool(!lr_overridden)},
        {"wd_mult", mg::py_float(wd_mult)}, {"lr_mult", mg::py_float(1.0)}, {"is_decoupled_lr", mg::py_bool(false)},
        {"max_lr", mg::py_float(max_lr)}, {"min_lr", mg::py_float(min_lr)}, {"lr", mg::py_float(s.schedule.lr(max_lr, min_lr))},
        {"weight_decay", mg::py_float(s.schedule.weight_decay() * wd_mult)}, {"maximize", mg::py_bool(false)},
        {"foreach", mg::py_none()}, {"differentiable", mg::py_bool(false)}, {"fused", mg::py_none()}}));
    auto& fields = out.back()->entries;
    if (o.optimizer == "sgd") {  // torch.optim.SGD's own fields
      for (auto& [key, value] : std::vector<std::pair<std::string, mg::PyRef>>{
               {"momentum", mg::py_float(o.sgd_momentum)}, {"dampening", mg::py_float(0.0)}, {"nesterov", mg::py_bool(false)}})
        fields.emplace_back(mg::py_str(key), value);
      continue;
    }
    for (auto& [key, value] : std::vector<std::pair<std::string, mg::PyRef>>{
             {"betas", mg::py_tuple({mg::py_float(o.adam_beta1), mg::py_float(o.adam_beta2)})}, {"eps", mg::py_float(eps)},
             {"amsgrad", mg::py_bool(false)}, {"capturable", mg::py_bool(false)}, {"decoupled_weight_decay", mg::py_bool(true)}})
      fields.emplace_back(mg::py_str(key), value);
    if (step) out.back()->entries.emplace_back(mg::py_str("step"), mg::py_int(*step));
  }
  return mg::py_list(std::move(out));
}

// OptimizerParamScheduler.state_dict(): every step count in samples.
mg::PyRef scheduler(const TrainingState& s) {
  const checkpoint::SchedulerState v = scheduler_state(s.schedule.config());
  return mg::py_dict({{"max_lr", mg::py_float(v.max_lr)}, {"lr_warmup_steps", mg::py_int(v.lr_warmup_steps)},
                      {"num_steps", mg::py_int(s.schedule.num_steps())}, {"lr_decay_style", mg::py_str(v.lr_decay_style)},
                      {"lr_decay_steps", mg::py_int(v.lr_decay_steps)}, {"min_lr", mg::py_float(v.min_lr)},
                      {"start_wd", mg::py_float(v.start_wd)}, {"end_wd", mg::py_float(v.end_wd)},
                      {"wd_incr_style", mg::py_str(v.wd_incr_style)}, {"wd_incr_steps", mg::py_int(v.wd_incr_steps)}});
}

// Megatron's grad scaler state: DynamicGradScaler's scale (a 1-element fp32 tensor) and trackers,
// or ConstantGradScaler's empty dict (--loss-scale).
mg::PyRef grad_scaler(const TrainingState& s, mg::TorchSaveWriter& w) {
  if (!s.config.precision.dynamic_loss_scale()) return mg::py_dict({});
  return mg::py_dict({{"scale", w.tensor(torch::tensor({float(s.scaler.scale())}))},
                      {"growth_tracker", mg::py_int(s.scaler.growth_tracker())},
                      {"hysteresis_tracker", mg::py_int(s.scaler.hysteresis_tracker())}});
}

// Megatron's distributed optimizer's common state in its `fully_reshardable` layout: the
// parameter groups, each with Adam's step (an integer, as Megatron writes it for Transformer
// Engine's and Apex's fused Adam, whose kernels take an int; torch.optim's path reads it as a
// number either way), the fp16
// loss scaler, and the layout's name; its per-parameter state is in the sharded tensors
// optimizer.state.{param,exp_avg,exp_avg_sq}.*.
mg::PyRef distributed_optimizer_common_state(const TrainingState& s, const std::vector<MegatronParamGroup>& groups,
                                             mg::TorchSaveWriter& w, bool experts) {
  std::vector<std::pair<std::string, mg::PyRef>> state = {
      {"optimizer", mg::py_dict({{"param_groups", param_groups(s, groups, experts, int64_t(s.optimizer.step_count()))}})}};
  if (s.config.precision.params_dtype == ParamDtype::Fp16) state.emplace_back("grad_scaler", grad_scaler(s, w));
  state.emplace_back("param_state_sharding_type", mg::py_str("fully_reshardable"));
  return mg::py_dict(std::move(state));
}

// One optimizer's common state: Adam's step and the parameter groups; Megatron's mixed-precision
// optimizer nests the torch.optim state, its fp32 main weights being sharded tensors
// (optimizer.state.fp32_param.*), with the fp16 loss scaler beside.
mg::PyRef optimizer_common_state(const TrainingState& s, const std::vector<MegatronParamGroup>& groups,
                                 mg::TorchSaveWriter& w, bool experts) {
  if (s.config.distributed.distributed_optimizer) return distributed_optimizer_common_state(s, groups, w, experts);
  // torch.optim.SGD counts no steps: Megatron then writes no common step.
  mg::PyRef state = mg::py_dict({});
  if (s.config.optimizer.optimizer != "sgd")
    state = mg::py_dict({{"common_step", w.tensor(torch::tensor(float(s.optimizer.step_count())).reshape({}))}});
  mg::PyRef optimizer = mg::py_dict({{"state", state}, {"param_groups", param_groups(s, groups, experts)}});
  if (s.config.precision.params_dtype == ParamDtype::Fp32) return optimizer;
  std::vector<std::pair<std::string, mg::PyRef>> mixed = {{"optimizer", optimizer}};
  if (s.config.precision.params_dtype == ParamDtype::Fp16) mixed.emplace_back("grad_scaler", grad_scaler(s, w));
  return mg::py_dict(std::move(mixed));
}

// fp8tron's RNG states of every rank and the layout they belong to (mg::kFp8tronRngStateKey).
mg::PyRef rng_states(const TrainingState& s, const std::vector<std::vector<checkpoint::RngState>>& rng,
                     mg::TorchSaveWriter& w) {
  const checkpoint::ParallelLayout l = layout_of(s);
  std::vector<mg::PyRef> ranks;
  for (const auto& states : rng) {
    std::vector<std::pair<std::string, mg::PyRef>> generators;
    for (const checkpoint::RngState& r : states) {
      torch::Tensor bytes = torch::empty({int64_t(r.state.size())}, torch::kUInt8);
      if (!r.state.empty()) std::memcpy(bytes.data_ptr(), r.state.data(), r.state.size());
      generators.emplace_back(r.name, w.tensor(bytes));
    }
    ranks.push_back(mg::py_dict(std::move(generators)));
  }
  return mg::py_dict({{"layout", mg::py_int_tuple({l.tp, l.pp, l.dp, l.cp, l.ep, l.vpp, l.world_size, l.etp})},
                      {"ranks", mg::py_list(std::move(ranks))}});
}

}  // namespace

std::string megatron_common_state_bytes(const TrainingState& s, int64_t iteration,
                                        const std::vector<MegatronParamGroup>& groups,
                                        const std::vector<std::vector<checkpoint::RngState>>& rng,
                                        CommonStateFile file) {
  mg::TorchSaveWriter w;
  std::vector<std::pair<std::string, mg::PyRef>> common = {
      {"args", args_namespace(s)}, {"checkpoint_version", mg::py_float(3.0)}, {"iteration", mg::py_int(iteration)}};
  if (s.config.checkpoint.save_optim) {
    mg::PyRef optimizer = optimizer_common_state(s, groups, w, false);
    if (s.config.model.moe.enabled()) {
      // Megatron's ChainedOptimizer of the dense and the expert parameters' optimizers: {0: , 1: }.
      optimizer = mg::make_value(mg::PyValue::Kind::Dict);
      optimizer->entries.emplace_back(mg::py_int(0), optimizer_common_state(s, groups, w, false));
      optimizer->entries.emplace_back(mg::py_int(1), optimizer_common_state(s, groups, w, true));
    }
    common.emplace_back("optimizer", optimizer);
    common.emplace_back("opt_param_scheduler", scheduler(s));
  }
  const double flops = s.megatron ? s.megatron->flops_per_sample * double(s.consumed_train_samples) : 0.0;
  common.emplace_back("num_floating_point_operations_so_far", mg::py_float(flops));
  // Megatron's _build_sharded_state_dict_metadata: how the optimizer state is laid out, which
  // Megatron's loader follows whatever its own flags say.
  std::vector<std::pair<std::string, mg::PyRef>> content;
  if (s.config.distributed.distributed_optimizer) {
    content.emplace_back("distrib_optim_sharding_type", mg::py_str("fully_reshardable"));
    content.emplace_back("distrib_optim_fully_reshardable_mem_efficient", mg::py_bool(false));
  }
  content.emplace_back("singleton_local_shards", mg::py_bool(false));
  content.emplace_back("chained_optim_avoid_prefix", mg::py_bool(true));
  common.emplace_back("content_metadata", mg::py_dict(std::move(content)));
  if (!rng.empty()) common.emplace_back(mg::kFp8tronRngStateKey, rng_states(s, rng, w));
  if (file == CommonStateFile::kCommonPt) return w.bytes(mg::py_dict(std::move(common)));
  // Megatron stores each ShardedObject's data in a list of the replicas it saved: one here.
  return w.bytes(mg::py_list({mg::py_dict(std::move(common))}));
}

}  // namespace fp8tron
