#include "checkpoint/megatron/megatron_checkpoint.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <optional>
#include <regex>
#include <set>

#include "checkpoint/megatron/damage.h"
#include "checkpoint/megatron/dcp_checkpoint.h"
#include "checkpoint/megatron/distributed_optimizer_buffers.h"
#include "checkpoint/megatron/legacy_model_parallel.h"
#include "checkpoint/megatron/torch_archive.h"
#include "core/error.h"
#include "core/text.h"
#include "core/param_roles.h"

namespace fp8tron::checkpoint::megatron {
namespace fs = std::filesystem;
namespace {

constexpr const char* kExpAvg = "optimizer.state.exp_avg.";
constexpr const char* kExpAvgSq = "optimizer.state.exp_avg_sq.";
constexpr const char* kMomentum = "optimizer.state.momentum_buffer.";  // torch.optim.SGD's
constexpr const char* kFp32Param = "optimizer.state.fp32_param.";
// The distributed optimizer's fp32 main weights in its fully_reshardable layout.
constexpr const char* kDistributedParam = "optimizer.state.param.";
constexpr const char* kLayers = "decoder.layers.";

// Megatron's local-layer names -> the fused names of fp8tron's (and Transformer Engine's) layers.
std::string fp8tron_name(std::string name) {
  static const std::pair<const char*, const char*> kRenames[] = {
      {".input_layernorm.weight", ".self_attention.linear_qkv.layer_norm_weight"},
      {".input_layernorm.bias", ".self_attention.linear_qkv.layer_norm_bias"},
      {".pre_mlp_layernorm.weight", ".mlp.linear_fc1.layer_norm_weight"},
      {".pre_mlp_layernorm.bias", ".mlp.linear_fc1.layer_norm_bias"}};
  for (const auto& [from, to] : kRenames)
    if (name.ends_with(from)) return name.substr(0, name.size() - std::strlen(from)) + to;
  // Sequential experts of a torch checkpoint: ...mlp.experts.local_experts.<e>.linear_fc1.weight (or
  // .bias)
  // -> ...mlp.experts.linear_fc1.weight<e> (fp8tron's and Transformer Engine's grouped names).
  static const std::regex kLocalExpert(R"((.*\.mlp\.experts\.)local_experts\.(\d+)\.(linear_fc[12]\.(?:weight|bias))$)");
  std::smatch m;
  if (std::regex_match(name, m, kLocalExpert)) return m[1].str() + m[3].str() + m[2].str();
  return name;
}

// Whether fp8tron's parameter `name` is a routed expert's (mlp.experts.linear_fc<k>.weight<e>):
// Megatron gives those an optimizer of their own. Shared experts (mlp.shared_experts.) are dense.
bool is_routed_expert_weight(const std::string& name) { return name.find(".mlp.experts.") != std::string::npos; }

int64_t int_attribute(const PyRef& v, const char* key, const std::string& where) {
  int64_t out = 0;
  if (!as_int(attribute(v, key), out)) throw UserError(where + ": holds no integer " + key);
  return out;
}

// The scheduler's state dict and the saved run's arguments, common to both formats.
void read_common(const PyRef& root, const std::string& where, MegatronCheckpoint& out) {
  out.iteration = int_attribute(root, "iteration", where);
  const PyRef args = attribute(root, "args");
  if (!is_call_of(args, "argparse", "Namespace")) throw UserError(where + ": holds no argparse namespace 'args'");
  as_int(attribute(args, "consumed_train_samples"), out.consumed_train_samples);
  as_int(attribute(args, "consumed_valid_samples"), out.consumed_valid_samples);
  for (const char* key : {"num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "padded_vocab_size",
                          "max_position_embeddings", "seq_length", "num_experts"}) {
    int64_t v = 0;
    if (as_int(attribute(args, key), v)) out.model_args[key] = v;
  }
  const PyRef swiglu = attribute(args, "swiglu"), untie = attribute(args, "untie_embeddings_and_output_weights");
  out.gated_linear_unit = swiglu && swiglu->kind == PyValue::Kind::Bool && swiglu->boolean;
  out.tied_embeddings = !(untie && untie->kind == PyValue::Kind::Bool && untie->boolean);
  as_int(attribute(args, "tensor_model_parallel_size"), out.tensor_parallel);
  const PyRef sched = attribute(root, "opt_param_scheduler");
  if (is_none(sched)) return;
  SchedulerValues s;
  if (!as_double(attribute(sched, "max_lr"), s.max_lr) || !as_double(attribute(sched, "min_lr"), s.min_lr) ||
      !as_int(attribute(sched, "lr_warmup_steps"), s.lr_warmup_steps) ||
      !as_int(attribute(sched, "lr_decay_steps"), s.lr_decay_steps) ||
      !as_string(attribute(sched, "lr_decay_style"), s.lr_decay_style) ||
      !as_int(attribute(sched, "num_steps"), s.num_steps))
    throw UserError(where + ": a malformed opt_param_scheduler " + describe(sched));
  as_double(attribute(sched, "start_wd"), s.start_wd);
  as_double(attribute(sched, "end_wd"), s.end_wd);
  as_int(attribute(sched, "wd_incr_steps"), s.wd_incr_steps);
  as_string(attribute(sched, "wd_incr_style"), s.wd_incr_style);
  out.scheduler = s;
}

// The optimizer state cannot be loaded, for `why`: none of it is kept, so that the weights load
// alone (--no-load-optim); a load of the optimizer state is refused with `why`.
void refuse_optimizer(const std::string& why, MegatronCheckpoint& out) {
  if (out.optimizer_refusal.empty()) out.optimizer_refusal = why;
  std::erase_if(out.tensors, [](const auto& entry) { return entry.first.starts_with("optimizer."); });
  out.step.reset();
  out.loss_scaler.reset();
  out.optimizer.clear();
}

// Records whose state a checkpoint's optimizer tensors are; both optimizers in one is refused.
void note_optimizer(const std::string& kind, const std::string& where, MegatronCheckpoint& out) {
  if (!out.optimizer.empty() && out.optimizer != kind)
    throw UserError(where + ": the optimizer state mixes Adam's moments and SGD's momentum; pass --no-load-optim");
  out.optimizer = kind;
}

// The fp16 loss scaler of Megatron's mixed-precision optimizers ({"scale": tensor,
// "growth_tracker": int, "hysteresis_tracker": int}); nothing when absent (bf16 runs keep none).
void read_grad_scaler(const PyRef& scaler, const TorchArchive& archive, MegatronCheckpoint& out) {
  int64_t growth = 0, hysteresis = 0;
  if (attribute(scaler, "scale") && as_int(attribute(scaler, "growth_tracker"), growth) &&
      as_int(attribute(scaler, "hysteresis_tracker"), hysteresis))
    out.loss_scaler = LossScalerValues{archive.tensor(attribute(scaler, "scale"), "grad_scaler scale").item<double>(),
                                       growth, hysteresis};
}

// Adam's step as the parameter groups of Megatron's distributed optimizer hold it (each group's
// "step", all alike), if they do.
void read_group_steps(const PyRef& optimizer, const std::string& where, MegatronCheckpoint& out) {
  const PyRef groups = attribute(optimizer, "param_groups");
  if (!groups || groups->kind != PyValue::Kind::List) return;
  for (const PyRef& g : groups->items) {
    double step = 0;
    if (!as_double(attribute(g, "step"), step)) continue;
    if (out.step && *out.step != step)
      throw UserError(where + ": parameter groups stepped " + std::to_string(int64_t(*out.step)) + " and " +
                      std::to_string(int64_t(step)) + " times");
    out.step = step;
  }
}

// ---- torch (legacy) --------------------------------------------------------------------------

// Megatron's default parameter groups: weight decay for all but biases and 1-D weights.
bool decayed(const std::string& name, const StoredTensor& t) { return !name.ends_with(".bias") && t.shape().size() > 1; }

// A Python bool (or int) under `v`.
bool as_flag(const PyRef& v, bool& out) {
  int64_t i = 0;
  if (!as_int(v, i)) return false;
  out = i != 0;
  return true;
}

// What sets a parameter group apart, by Megatron's rules (as optim/param_groups.h applies them): no
// weight decay, and the learning rate of --decoupled-lr (the embedding and output layer) or of MuP
// (the hidden matrices, whose Adam epsilon MuP scales too).
enum class LegacyLr { kBase, kDecoupled, kMup };
struct LegacyGroupKind {
  bool no_decay = false;
  LegacyLr lr = LegacyLr::kBase;
  bool operator<(const LegacyGroupKind& o) const { return std::pair{no_decay, int(lr)} < std::pair{o.no_decay, int(o.lr)}; }
  bool operator==(const LegacyGroupKind&) const = default;
};

// Each saved group's kind, from its own values: wd_mult 0 (or weight_decay 0) is no decay; a group
// Megatron marks as not on the default configuration takes its learning rate from --decoupled-lr,
// or from MuP when its epsilon differs from a default group's.
std::vector<LegacyGroupKind> legacy_group_kinds(const PyRef& groups) {
  std::optional<double> default_eps;
  for (const PyRef& g : groups->items) {
    bool is_default = false;
    double eps = 0;
    if (as_flag(attribute(g, "default_config"), is_default) && is_default && as_double(attribute(g, "eps"), eps))
      default_eps = eps;
  }
  std::vector<LegacyGroupKind> kinds;
  for (const PyRef& g : groups->items) {
    LegacyGroupKind k;
    double wd = 0;
    if (!as_double(attribute(g, "wd_mult"), wd)) as_double(attribute(g, "weight_decay"), wd);
    k.no_decay = wd == 0;
    bool is_default = true, decoupled = false;
    as_flag(attribute(g, "default_config"), is_default);
    double eps = 0;
    if (as_flag(attribute(g, "is_decoupled_lr"), decoupled) && decoupled) k.lr = LegacyLr::kDecoupled;
    else if (!is_default)
      k.lr = default_eps && as_double(attribute(g, "eps"), eps) && eps != *default_eps ? LegacyLr::kMup : LegacyLr::kDecoupled;
    kinds.push_back(k);
  }
  return kinds;
}

// The kind of group Megatron puts a parameter in, given which overrides the saved groups use.
LegacyGroupKind legacy_param_kind(const std::string& name, const StoredTensor& t, bool decoupled, bool mup) {
  LegacyGroupKind k;
  k.no_decay = !decayed(name, t);
  if (decoupled && is_embedding_or_output(name)) k.lr = LegacyLr::kDecoupled;
  else if (mup && !is_mup_vector_like(name, int64_t(t.shape().size()))) k.lr = LegacyLr::kMup;
  return k;
}

using NamedTensors = std::vector<std::pair<std::string, StoredTensor>>;

// torch.optim's state dict numbers the parameters group by group; each of Megatron's groups takes
// the model's parameters of its kind in model order. Megatron's mixed-precision optimizer (bf16 and
// fp16 runs) wraps that state dict: {"optimizer": it, "grad_scaler": the fp16 loss scaler,
// "fp32_from_fp16_params": the fp32 main weights, a list per group in the group's order}.
void read_legacy_optimizer(const TorchArchive& a, PyRef optimizer, const NamedTensors& params, MegatronCheckpoint& out) {
  const std::string& where = a.source();
  PyRef main_weights;
  if (attribute(optimizer, "optimizer")) {
    read_grad_scaler(attribute(optimizer, "grad_scaler"), a, out);
    main_weights = attribute(optimizer, "fp32_from_fp16_params");
    if (!main_weights) main_weights = attribute(optimizer, "fp32_from_fp16");  // older Megatron
    optimizer = attribute(optimizer, "optimizer");
  }
  const PyRef state = attribute(optimizer, "state"), groups = attribute(optimizer, "param_groups");
  if (!state || !groups || groups->kind != PyValue::Kind::List)
    throw UserError(where + ": the optimizer state is not torch.optim's nor Megatron's mixed-precision wrapping of "
                            "it; pass --no-load-optim to load the weights only");
  if (main_weights && (main_weights->kind != PyValue::Kind::List || main_weights->items.size() != groups->items.size()))
    throw UserError(where + ": fp32_from_fp16_params does not hold one list of main weights per parameter group; "
                            "pass --no-load-optim");
  const std::vector<LegacyGroupKind> kinds = legacy_group_kinds(groups);
  const auto uses = [&](LegacyLr lr) { return std::any_of(kinds.begin(), kinds.end(), [lr](auto& k) { return k.lr == lr; }); };
  const bool decoupled = uses(LegacyLr::kDecoupled), mup = uses(LegacyLr::kMup);
  if (std::set<LegacyGroupKind>(kinds.begin(), kinds.end()).size() != kinds.size())
    throw UserError(where + ": two optimizer parameter groups of the same kind (learning-rate multipliers or "
                            "overrides fp8tron does not map); pass --no-load-optim");
  std::map<int64_t, std::string> by_index;
  for (size_t g = 0; g < kinds.size(); ++g) {
    std::vector<int64_t> indices;
    if (!as_int_list(attribute(groups->items[g], "params"), indices))
      throw UserError(where + ": a parameter group lists no params");
    const PyRef mains = main_weights ? main_weights->items[g] : PyRef();
    if (mains && (mains->kind != PyValue::Kind::List || mains->items.size() != indices.size()))
      throw UserError(where + ": fp32_from_fp16_params of parameter group " + std::to_string(g) +
                      " does not hold one main weight per parameter of the group; pass --no-load-optim");
    size_t next = 0;
    for (const auto& [name, tensor] : params) {
      if (!(legacy_param_kind(name, tensor, decoupled, mup) == kinds[g])) continue;
      if (next == indices.size())
        throw UserError(where + ": optimizer parameter group " + std::to_string(g) + " has fewer parameters than the "
                                "model has of its kind");
      if (mains) {
        StoredTensor main = a.stored(mains->items[next], "the fp32 main weight of " + name, out.legacy_tensor_reads);
        if (main.shape() != tensor.shape() || main.dtype() != torch::kFloat32)
          throw UserError(where + ": the fp32 main weight of " + name + " is not an fp32 tensor of the parameter's "
                                  "shape; pass --no-load-optim");
        out.tensors[kFp32Param + name] = main;
      }
      by_index[indices[next++]] = name;
    }
    if (next != indices.size())
      throw UserError(where + ": optimizer parameter group " + std::to_string(g) + " has more parameters than the "
                              "model has of its kind");
  }
  for (const auto& [index_value, entry] : state->entries) {
    int64_t index = 0;
    if (!as_int(index_value, index) || !by_index.count(index))
      throw UserError(where + ": optimizer state for unknown parameter " + describe(index_value));
    const std::string& name = by_index[index];
    const std::vector<int64_t>& shape = out.tensors.at(name).shape();
    // torch.optim.SGD keeps a momentum buffer per parameter (with a non-zero momentum), Adam both moments.
    const bool sgd = attribute(entry, "momentum_buffer") && !attribute(entry, "exp_avg");
    note_optimizer(sgd ? "sgd" : "adam", where, out);
    using Keys = std::vector<std::pair<const char*, const char*>>;
    for (const auto& [key, prefix] : sgd ? Keys{{"momentum_buffer", kMomentum}}
                                         : Keys{{"exp_avg", kExpAvg}, {"exp_avg_sq", kExpAvgSq}}) {
      StoredTensor t = a.stored(attribute(entry, key), std::string(key) + " of " + name, out.legacy_tensor_reads);
      if (t.shape() != shape)
        throw UserError(where + ": " + key + " of " + name + " has another shape than the parameter");
      out.tensors[prefix + name] = t;
    }
    const PyRef step = attribute(entry, "step");
    if (!step) continue;
    double value = 0;
    if (!as_double(step, value)) value = a.tensor(step, "step of " + name).item<double>();
    if (out.step && *out.step != value)
      throw UserError(where + ": the optimizer stepped " + std::to_string(int64_t(*out.step)) + " times for one "
                              "parameter and " + std::to_string(int64_t(value)) + " for " + name);
    out.step = value;
  }
}

// Megatron's optimizer of a model with mixture-of-experts layers is a chain of two, one for the
// dense parameters and one for the routed experts' (ChainedOptimizer); the torch format stores
// the list of their state dicts, each numbering its own parameters in model order.
void read_legacy_optimizers(const TorchArchive& a, const PyRef& optimizer, const NamedTensors& params,
                            MegatronCheckpoint& out) {
  if (optimizer->kind != PyValue::Kind::List) return read_legacy_optimizer(a, optimizer, params, out);
  if (optimizer->items.size() != 2)
    throw UserError(a.source() + ": a chain of " + std::to_string(optimizer->items.size()) + " optimizers; fp8tron "
                                 "reads Megatron's pair of the dense and the expert parameters' optimizers; pass "
                                 "--no-load-optim to load the weights only");
  NamedTensors dense, experts;
  for (const auto& p : params) (is_routed_expert_weight(p.first) ? experts : dense).push_back(p);
  read_legacy_optimizer(a, optimizer->items[0], dense, out);
  read_legacy_optimizer(a, optimizer->items[1], experts, out);
}

// Megatron's distributed optimizer in the torch format: model_optim_rng.pt keeps only its
// parameter groups ({"optimizer": {"param_groups": [...]}, "grad_scaler": ...}, Adam's step in each
// group), its state lies in distrib_optim.pt beside it. A chained optimizer's is a list of those.
bool read_legacy_distributed_optimizer_groups(const TorchArchive& a, const PyRef& optimizer, MegatronCheckpoint& out) {
  std::vector<PyRef> chain;
  if (optimizer->kind == PyValue::Kind::List) chain = optimizer->items;
  else chain.push_back(optimizer);
  for (const PyRef& o : chain) {
    const PyRef inner = attribute(o, "optimizer");
    if (!inner || !attribute(inner, "param_groups") || attribute(inner, "state") || attribute(o, "fp32_from_fp16_params"))
      return false;
  }
  for (const PyRef& o : chain) {
    read_grad_scaler(attribute(o, "grad_scaler"), a, out);
    read_group_steps(attribute(o, "optimizer"), a.source(), out);
  }
  out.legacy_distributed_optimizer = true;
  return true;
}

// One rank's model_optim_rng.pt, with its stage's local layer numbers; its tensors are read when
// asked, and `tally` counts their bytes.
MegatronCheckpoint read_legacy_file(const std::string& path, const std::shared_ptr<BytesRead>& tally) {
  MegatronCheckpoint out;
  out.format = "torch";
  out.path = path;
  out.legacy_tensor_reads = tally;
  TorchArchive a(out.path);
  read_common(a.root(), out.path, out);
  const PyRef model = attribute(a.root(), "model");
  if (!model)
    throw UserError(out.path + ": holds no 'model' (a virtual-pipeline checkpoint has model0, model1, ...; "
                               "fp8tron reads one model chunk)");
  NamedTensors params;  // Megatron's names, model order
  // The state dict's items; its attributes (_metadata) are not tensors.
  for (const auto& [key, value] : model->entries) {
    std::string name;
    if (!as_string(key, name)) throw UserError(out.path + ": a model state key is not a string");
    if (name.ends_with("._extra_state")) continue;
    params.emplace_back(name, a.stored(value, name, tally));
    out.tensors[fp8tron_name(name)] = params.back().second;
  }
  const PyRef optimizer = attribute(a.root(), "optimizer");
  if (is_none(optimizer)) return out;
  // read_legacy_optimizer needs the fp8tron names as keys of out.tensors; the optimizer has no
  // state for the model's buffers.
  NamedTensors renamed;
  for (const auto& [name, t] : params)
    if (!is_model_buffer(name)) renamed.emplace_back(fp8tron_name(name), t);
  try {
    if (read_legacy_distributed_optimizer_groups(a, optimizer, out)) return out;
    read_legacy_optimizers(a, optimizer, renamed, out);
  } catch (const DamagedCheckpoint&) {
    throw;
  } catch (const UserError& e) {
    refuse_optimizer(e.what(), out);
  }
  return out;
}

// The saving run's layout, from the arguments in one of its rank files.
LegacyLayout saved_legacy_layout(const std::string& path) {
  TorchArchive a(path);
  const PyRef args = attribute(a.root(), "args");
  LegacyLayout layout;
  as_int(attribute(args, "tensor_model_parallel_size"), layout.tensor_parallel);
  as_int(attribute(args, "pipeline_model_parallel_size"), layout.pipeline_parallel);
  as_int(attribute(args, "expert_model_parallel_size"), layout.expert_parallel);
  as_int(attribute(args, "expert_tensor_parallel_size"), layout.expert_tensor_parallel);
  return layout;
}

// The state of a legacy checkpoint's distributed optimizer, from each rank file's distrib_optim.pt,
// once the weights are put together; the optimizer is refused (the weights still load) when it
// cannot be read.
void read_legacy_optimizer_files(const std::vector<LegacyRankFile>& files, MegatronCheckpoint& out,
                                 const std::set<std::string>* weights_read) {
  if (!out.legacy_distributed_optimizer || !out.optimizer_refusal.empty()) return;
  std::vector<std::string> paths;
  for (const LegacyRankFile& f : files) paths.push_back(fs::path(f.path).replace_filename("distrib_optim.pt").string());
  try {
    read_legacy_distributed_optimizer(paths, out, weights_read);
  } catch (const DamagedCheckpoint&) {
    throw;
  } catch (const UserError& e) {
    refuse_optimizer(e.what(), out);
  }
}

int64_t num_experts_of(const MegatronCheckpoint& c) {
  return c.model_args.count("num_experts") ? c.model_args.at("num_experts") : 0;
}

// parts[stage][tensor rank] of legacy rank files (sorted by stage, tensor rank, expert rank), the
// expert-parallel ranks' files of each put together first.
std::vector<std::vector<MegatronCheckpoint>> legacy_parts(const std::vector<LegacyRankFile>& files,
                                                          const std::shared_ptr<BytesRead>& tally) {
  std::vector<std::vector<MegatronCheckpoint>> parts;
  for (size_t i = 0; i < files.size();) {
    const LegacyRankFile& f = files[i];
    std::vector<MegatronCheckpoint> experts;
    for (; i < files.size() && files[i].pp_rank == f.pp_rank && files[i].tp_rank == f.tp_rank; ++i)
      experts.push_back(read_legacy_file(files[i].path, tally));
    if (size_t(f.pp_rank) == parts.size()) parts.emplace_back();
    if (experts.size() == 1) {
      parts.back().push_back(std::move(experts.front()));
    } else {
      const int64_t num_experts = num_experts_of(experts.front());
      parts.back().push_back(merge_expert_ranks(std::move(experts), num_experts));
    }
  }
  return parts;
}

// The same where each tensor-parallel rank holds whole experts (--expert-tensor-parallel-size 1):
// a stage's files do not cover every (tensor rank, expert rank) pair, so each tensor rank's part is
// the dense tensors of a file of that tensor rank with the experts of every expert rank, each from
// a file of that expert rank.
std::vector<std::vector<MegatronCheckpoint>> legacy_parts_with_whole_experts(const std::vector<LegacyRankFile>& files,
                                                                              const std::shared_ptr<BytesRead>& tally) {
  std::map<std::string, MegatronCheckpoint> read;
  const auto file = [&](const LegacyRankFile& f) -> const MegatronCheckpoint& {
    auto it = read.find(f.path);
    if (it == read.end()) it = read.emplace(f.path, read_legacy_file(f.path, tally)).first;
    return it->second;
  };
  int stages = 0, tensor_ranks = 0, expert_ranks = 0;
  for (const LegacyRankFile& f : files)
    stages = std::max(stages, f.pp_rank + 1), tensor_ranks = std::max(tensor_ranks, f.tp_rank + 1),
    expert_ranks = std::max(expert_ranks, f.ep_rank + 1);
  const auto first_of = [&](int stage, auto&& wanted) -> const LegacyRankFile& {
    return *std::find_if(files.begin(), files.end(), [&](const LegacyRankFile& f) { return f.pp_rank == stage && wanted(f); });
  };
  std::vector<std::vector<MegatronCheckpoint>> parts(static_cast<size_t>(stages));
  for (int p = 0; p < stages; ++p) {
    std::vector<MegatronCheckpoint> by_expert_rank;
    for (int x = 0; x < expert_ranks; ++x)
      by_expert_rank.push_back(file(first_of(p, [x](const LegacyRankFile& f) { return f.ep_rank == x; })));
    const int64_t num_experts = num_experts_of(by_expert_rank.front());
    const MegatronCheckpoint experts = merge_expert_ranks(std::move(by_expert_rank), num_experts);
    for (int t = 0; t < tensor_ranks; ++t) {
      MegatronCheckpoint part = file(first_of(p, [t](const LegacyRankFile& f) { return f.tp_rank == t; }));
      std::erase_if(part.tensors, [](const auto& e) { return is_routed_expert_tensor(e.first); });
      for (const auto& [name, tensor] : experts.tensors)
        if (is_routed_expert_tensor(name)) part.tensors.emplace(name, tensor);
      parts[size_t(p)].push_back(std::move(part));
    }
  }
  return parts;
}

MegatronCheckpoint read_legacy(const std::string& dir, const std::set<std::string>* weights_read) {
  const LegacyLayout saved = saved_legacy_layout(first_legacy_rank_file(dir));
  const std::vector<LegacyRankFile> files = legacy_rank_files(dir, saved);
  const auto tally = std::make_shared<BytesRead>();
  if (files.size() == 1) {
    MegatronCheckpoint out = read_legacy_file(files[0].path, tally);
    read_legacy_optimizer_files(files, out, weights_read);
    return out;
  }
  const bool whole_experts = experts_whole_on_tensor_ranks(saved);
  std::vector<std::vector<MegatronCheckpoint>> parts =
      whole_experts ? legacy_parts_with_whole_experts(files, tally) : legacy_parts(files, tally);
  std::string refusal;
  for (const auto& stage : parts)
    for (const MegatronCheckpoint& part : stage)
      if (refusal.empty()) refusal = part.optimizer_refusal;
  const MegatronCheckpoint& first = parts.front().front();
  MegatronCheckpoint out =
      merge_legacy_ranks(std::move(parts), first.gated_linear_unit, first.tied_embeddings, whole_experts);
  out.path = dir;
  if (!refusal.empty()) refuse_optimizer(refusal, out);
  read_legacy_optimizer_files(files, out, weights_read);
  return out;
}

// ---- torch_dist ------------------------------------------------------------------------------

// One transformer layer's field (fp8tron's name, `head` the layer's prefix) of the stored tensor,
// at `index` in its stacked dimensions: the routed experts of an MoE layer (Megatron's sequential
// and grouped experts, stored alike as mlp.experts.experts.linear_fc<k>.weight) stacked over the
// experts next, become one tensor per global expert, mlp.experts.linear_fc<k>.weight<e>.
void add_layer_field(const std::shared_ptr<const DcpCheckpoint>& dcp, const std::string& stored,
                     const std::vector<int64_t>& index, const std::string& head, const std::string& field,
                     MegatronCheckpoint& out) {
  static const std::string kStackedExperts = "mlp.experts.experts.";
  if (!field.starts_with(kStackedExperts)) {
    out.tensors[head + field] = StoredTensor(dcp, stored, index);
    return;
  }
  const std::vector<int64_t>& shape = dcp->tensors().at(stored).shape;
  if (shape.size() <= index.size())
    throw DamagedCheckpoint(dcp->source() + ": " + stored + " is not stacked over the experts");
  const std::string expert = head + "mlp.experts." + field.substr(kStackedExperts.size());
  for (int64_t e = 0; e < shape[index.size()]; ++e) {
    std::vector<int64_t> at = index;
    at.push_back(e);
    out.tensors[expert + std::to_string(e)] = StoredTensor(dcp, stored, at);
  }
}

// A decoder-layer tensor `stored` ("decoder.layers." + `after_layers`) as one tensor per layer.
// Megatron stacks the layers' tensors along a first dimension of num_layers when its layers are
// alike (decoder.layers.<field>), and stores each under its own number when they are not
// (decoder.layers.<n>.<field>: --moe-layer-freq a list or above 1). The routed experts of an MoE
// layer (Megatron's sequential and grouped experts, stored alike as
// mlp.experts.experts.linear_fc<k>.weight) are stacked over the experts too and become one tensor
// per global expert, mlp.experts.linear_fc<k>.weight<e>.
void add_layer_tensors(const std::shared_ptr<const DcpCheckpoint>& dcp, const std::string& stored,
                       const std::string& prefix, const std::string& after_layers, MegatronCheckpoint& out) {
  static const std::regex kNumbered(R"(^(\d+)\.(.+)$)");
  const std::vector<int64_t>& shape = dcp->tensors().at(stored).shape;
  std::vector<std::pair<int64_t, std::vector<int64_t>>> layers;  // (layer, index of its tensor)
  std::string field = after_layers;
  std::smatch m;
  if (std::regex_match(after_layers, m, kNumbered)) {
    layers.push_back({std::stoll(m[1].str()), {}});
    field = m[2].str();
  } else {
    if (shape.empty()) throw DamagedCheckpoint(dcp->source() + ": " + stored + " is not stacked over the layers");
    for (int64_t i = 0; i < shape[0]; ++i) layers.push_back({i, {i}});
  }
  field = fp8tron_name(field);
  for (const auto& [layer, index] : layers)
    add_layer_field(dcp, stored, index, prefix + kLayers + std::to_string(layer) + ".", field, out);
}

// One optimizer's common state: Megatron's fp32 optimizer stores {state, param_groups}; its
// mixed-precision one nests that under "optimizer", beside the fp16 loss scaler's "grad_scaler";
// its distributed optimizer stores the layout of its per-parameter state
// (param_state_sharding_type) beside, and Adam's step in the parameter groups.
void read_optimizer_common(PyRef optimizer, const TorchArchive& common, MegatronCheckpoint& out) {
  std::string layout;
  if (as_string(attribute(optimizer, "param_state_sharding_type"), layout) && layout != "dp_reshardable" &&
      layout != "fully_reshardable" && layout != "fully_sharded_model_space")
    throw UserError(common.source() + ": the distributed optimizer's state is in Megatron's " + layout +
                    " layout, which fp8tron does not read (it reads dp_reshardable, fully_reshardable and "
                    "fully_sharded_model_space); pass --no-load-optim to load the weights");
  if (attribute(optimizer, "optimizer")) {
    read_grad_scaler(attribute(optimizer, "grad_scaler"), common, out);
    optimizer = attribute(optimizer, "optimizer");
  }
  const PyRef step = attribute(attribute(optimizer, "state"), "common_step");
  if (!step) return read_group_steps(optimizer, common.source(), out);
  const double value = common.tensor(step, "optimizer step").item<double>();
  if (out.step && *out.step != value)
    throw UserError(common.source() + ": the chained optimizers stepped " + std::to_string(int64_t(*out.step)) + " and " +
                    std::to_string(int64_t(value)) + " times");
  out.step = value;
}

// fp8tron's own RNG states, when fp8tron wrote the checkpoint (kFp8tronRngStateKey).
void read_fp8tron_rng(const PyRef& root, const TorchArchive& common, MegatronCheckpoint& out) {
  const PyRef rng = attribute(root, kFp8tronRngStateKey);
  if (!rng || is_none(rng)) return;
  const PyRef layout = attribute(rng, "layout"), ranks = attribute(rng, "ranks");
  if (!layout || layout->kind != PyValue::Kind::Tuple || !ranks || ranks->kind != PyValue::Kind::List)
    throw UserError(common.source() + ": a malformed " + std::string(kFp8tronRngStateKey));
  for (const PyRef& v : layout->items) {
    int64_t x = 0;
    if (!as_int(v, x)) throw UserError(common.source() + ": a malformed " + std::string(kFp8tronRngStateKey) + " layout");
    out.fp8tron_rng_layout.push_back(x);
  }
  for (size_t rank = 0; rank < ranks->items.size(); ++rank) {
    const PyRef& generators = ranks->items[rank];
    if (!generators || generators->kind != PyValue::Kind::Dict)
      throw UserError(common.source() + ": a malformed " + std::string(kFp8tronRngStateKey) + " entry");
    for (const auto& [name, value] : generators->entries) {
      if (!name || name->kind != PyValue::Kind::Str)
        throw UserError(common.source() + ": a malformed " + std::string(kFp8tronRngStateKey) + " entry");
      const torch::Tensor bytes = common.tensor(value, "the RNG state " + name->text).contiguous();
      out.fp8tron_rng.push_back({int(rank), name->text,
                                 std::string(static_cast<const char*>(bytes.data_ptr()), size_t(bytes.numel()))});
    }
  }
}

MegatronCheckpoint read_dist(const std::string& dir) {
  MegatronCheckpoint out;
  out.format = "torch_dist";
  out.path = dir;
  const auto stored = std::make_shared<const DcpCheckpoint>(dir);
  const DcpCheckpoint& dcp = *stored;
  out.dcp = stored;
  const auto common = dcp.common_state();
  const PyRef root = DcpCheckpoint::common_state_dict(*common);
  read_common(root, common->source(), out);
  read_fp8tron_rng(root, *common, out);
  // A ChainedOptimizer (expert parallelism: the dense and the expert parameters' optimizers)
  // stores {0: <one optimizer's state>, 1: ...}; they step together.
  const PyRef optimizer = attribute(root, "optimizer");
  std::string refusal;  // why the optimizer state cannot be loaded
  try {
    if (optimizer && optimizer->kind == PyValue::Kind::Dict && !optimizer->entries.empty() &&
        optimizer->entries.front().first->kind == PyValue::Kind::Int) {
      for (const auto& [index, state] : optimizer->entries) read_optimizer_common(state, *common, out);
    } else {
      read_optimizer_common(optimizer, *common, out);
    }
  } catch (const DamagedCheckpoint&) {
    throw;
  } catch (const UserError& e) {
    refusal = e.what();
  }
  static const std::regex kChained(R"(^chained_\d+\.optimizer\..*)");
  for (const auto& [name, entry] : dcp.tensors()) {
    if (is_distributed_optimizer_entry(name)) continue;  // read below, once the weights are
    if (std::regex_match(name, kChained)) {  // a chained optimizer's flat buffers (dcp_checkpoint.cpp)
      if (refusal.empty())
        refusal = dir + "/.metadata: optimizer tensor " + name + " is a chained optimizer's, in a layout fp8tron does "
                  "not read; pass --no-load-optim to load the weights";
      continue;
    }
    std::string prefix, param = name;
    for (const char* p : {kExpAvg, kExpAvgSq, kMomentum, kFp32Param, kDistributedParam})
      if (name.starts_with(p)) prefix = p == kDistributedParam ? kFp32Param : p, param = name.substr(std::strlen(p));
    if ((prefix == kExpAvg || prefix == kMomentum) && refusal.empty()) {
      try {
        note_optimizer(prefix == kMomentum ? "sgd" : "adam", dir + "/.metadata", out);
      } catch (const UserError& e) {
        refusal = e.what();
      }
    }
    if (!prefix.empty() || !name.starts_with("optimizer.")) {
      std::string head, rest;
      if (param.starts_with(kLayers)) add_layer_tensors(stored, name, prefix, param.substr(std::strlen(kLayers)), out);
      else if (split_mtp_transformer_layer(param, &head, &rest))  // never stacked over the layers
        add_layer_field(stored, name, {}, prefix + head, fp8tron_name(rest), out);
      else out.tensors[prefix + fp8tron_name(param)] = StoredTensor(stored, name, {});
      continue;
    }
    if (refusal.empty())
      refusal = dir + "/.metadata: optimizer tensor " + name + " is neither Adam's moments nor SGD's momentum; pass "
                "--no-load-optim";
  }
  if (!refusal.empty()) refuse_optimizer(refusal, out);
  return out;
}

void rename_tensors(const std::vector<std::pair<std::string, std::string>>& renames, MegatronCheckpoint& out) {
  for (const auto& [from, to] : renames) {
    out.tensors[to] = out.tensors.at(from);
    out.tensors.erase(from);
  }
}

// The norm before an MoE layer's MLP has the fused name of a dense layer's (mlp.linear_fc1.
// layer_norm_*: so Megatron's local layers save it, and the renaming above gives legacy names the
// same), but fp8tron's MoE layers (as Transformer Engine's) call it pre_mlp_layernorm.*: in a
// layer with a router (a decoder layer or a multi-token-prediction layer's) it takes that name,
// its optimizer states too.
void name_moe_pre_mlp_norms(MegatronCheckpoint& out) {
  static const std::regex kFusedNorm(
      R"(^(.*)((?:decoder\.layers\.\d+|mtp\.layers\.\d+\.transformer_layer)\.)mlp\.linear_fc1\.layer_norm_(weight|bias)$)");
  std::vector<std::pair<std::string, std::string>> renames;
  for (const auto& [name, tensor] : out.tensors) {
    std::smatch m;
    if (!std::regex_match(name, m, kFusedNorm) || !out.tensors.count(m[2].str() + "mlp.router.weight")) continue;
    renames.emplace_back(name, m[1].str() + m[2].str() + "pre_mlp_layernorm." + m[3].str());
  }
  rename_tensors(renames, out);
}

// Megatron's local multi-latent attention layers map none of their modules' names: the layer's
// input norm is input_layernorm (its down projections are no norm-fused linears), the latents'
// norms q_layernorm and kv_layernorm, the norm before a dense MLP pre_mlp_layernorm. fp8tron's MLA
// layers (as Transformer Engine's) keep input_layernorm and fuse the others into the next linear.
// In a layer with linear_kv_down_proj (a decoder layer or a multi-token-prediction layer's), those
// take fp8tron's names (a legacy file's input norm was renamed to linear_qkv's above: undone), their
// optimizer states too; an MoE layer's pre_mlp_layernorm is already fp8tron's.
void name_mla_norms(MegatronCheckpoint& out) {
  static const std::regex kMlaNorm(
      R"(^(.*)((?:decoder\.layers\.\d+|mtp\.layers\.\d+\.transformer_layer)\.)(self_attention\.linear_qkv\.layer_norm|self_attention\.q_layernorm|self_attention\.kv_layernorm|pre_mlp_layernorm)[._](weight|bias)$)");
  std::vector<std::pair<std::string, std::string>> renames;
  for (const auto& [name, tensor] : out.tensors) {
    std::smatch m;
    if (!std::regex_match(name, m, kMlaNorm) || !out.tensors.count(m[2].str() + "self_attention.linear_kv_down_proj.weight"))
      continue;
    const std::string norm = m[3].str(), field = m[4].str();
    if (norm == "pre_mlp_layernorm" && out.tensors.count(m[2].str() + "mlp.router.weight")) continue;
    const std::string to = norm == "self_attention.linear_qkv.layer_norm" ? "input_layernorm." + field
                           : norm == "self_attention.q_layernorm"       ? "self_attention.linear_q_up_proj.layer_norm_" + field
                           : norm == "self_attention.kv_layernorm"      ? "self_attention.linear_kv_up_proj.layer_norm_" + field
                                                                        : "mlp.linear_fc1.layer_norm_" + field;
    renames.emplace_back(name, m[1].str() + m[2].str() + to);
  }
  rename_tensors(renames, out);
}

}  // namespace

bool is_model_buffer(const std::string& name) { return name.ends_with(".router.expert_bias"); }

bool split_mtp_transformer_layer(const std::string& name, std::string* head, std::string* rest) {
  static const std::regex kMtpLayer(R"(^(mtp\.layers\.\d+\.transformer_layer\.)(.+)$)");
  std::smatch m;
  if (!std::regex_match(name, m, kMtpLayer)) return false;
  *head = m[1].str();
  *rest = m[2].str();
  return true;
}

std::string detect_format(const std::string& dir) {
  std::error_code ec;
  if (fs::exists(dir + "/metadata.json", ec)) {
    std::ifstream in(dir + "/metadata.json");
    const std::string text((std::istreambuf_iterator<char>(in)), {});
    for (const char* backend : {"torch_dist", "zarr", "fsdp_dtensor", "torch_dcp"})
      if (text.find(std::string("\"") + backend + "\"") != std::string::npos) return backend;
  }
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.path().filename().string().starts_with("mp_rank_0")) return "torch";
  if (fs::exists(dir + "/.metadata", ec)) return "torch_dcp";
  return "";
}

std::string format_refusal(const std::string& format, const std::string& ckpt_format, bool auto_detect,
                           const std::string& dir) {
  if (format != "torch_dist" && format != "torch")
    return "checkpoint " + dir + " is in Megatron's " + format +
           " format; fp8tron reads Megatron's torch_dist and torch checkpoints and its own";
  // Megatron detects the format when asked to, or when it expects a distributed checkpoint;
  // with --ckpt-format torch it reads legacy checkpoints only.
  if (format == "torch_dist" && !auto_detect && ckpt_format != "torch_dist" && ckpt_format != "fsdp_dtensor")
    return "checkpoint " + dir + " is a distributed (torch_dist) checkpoint but --ckpt-format is " + ckpt_format +
           ": pass --auto-detect-ckpt-format or --ckpt-format torch_dist";
  return "";
}

MegatronCheckpoint read_checkpoint(const std::string& dir, const std::string& format,
                                   const std::set<std::string>* weights_read) {
  FP8TRON_CHECK(format == "torch" || format == "torch_dist", "reading a Megatron checkpoint in format " + format);
  MegatronCheckpoint out = format == "torch" ? read_legacy(dir, weights_read) : read_dist(dir);
  name_moe_pre_mlp_norms(out);
  name_mla_norms(out);
  // The distributed optimizer's buffers, once the weights have fp8tron's names.
  if (format == "torch_dist" && out.optimizer_refusal.empty()) {
    try {
      read_distributed_optimizer_buffers(out, weights_read);
    } catch (const DamagedCheckpoint&) {
      throw;
    } catch (const UserError& e) {
      refuse_optimizer(e.what(), out);
    }
  }
  return out;
}

}  // namespace fp8tron::checkpoint::megatron
