#include "checkpoint/load_megatron.h"

#include <algorithm>
#include <functional>
#include <optional>
#include <set>

#include "checkpoint/fp8_recipe_state.h"
#include "checkpoint/megatron/damage.h"
#include "checkpoint/megatron/dcp_checkpoint.h"
#include "checkpoint/megatron/megatron_checkpoint.h"
#include "checkpoint/megatron/torch_archive.h"
#include "checkpoint/rank_agreement.h"
#include "checkpoint/rng_state.h"
#include "checkpoint/saved_tensors.h"
#include "checkpoint/scheduler_state.h"
#include "core/error.h"
#include "core/log.h"
#include "core/text.h"
#include "fp8/fp8_linear.h"
#include "optim/loss_scaler.h"
#include "optim/lr_schedule.h"

namespace fp8tron {
namespace ck = checkpoint;
namespace mg = checkpoint::megatron;
namespace {

// The saved run's model flags against this run's: one line naming every difference.
void check_model_args(const mg::MegatronCheckpoint& c, const ModelConfig& m) {
  const std::pair<const char*, int64_t> mine[] = {
      {"num_layers", m.num_layers}, {"hidden_size", m.hidden_size}, {"ffn_hidden_size", m.ffn_hidden_size},
      {"num_attention_heads", m.num_attention_heads}, {"padded_vocab_size", m.padded_vocab_size},
      {"max_position_embeddings", m.max_position_embeddings}, {"num_experts", m.moe.num_experts}};
  std::vector<std::string> differences;
  for (const auto& [key, value] : mine) {
    auto it = c.model_args.find(key);
    if (it == c.model_args.end() || it->second == value) continue;
    std::string flag = std::string("--") + key;
    std::replace(flag.begin(), flag.end(), '_', '-');
    differences.push_back(strprintf("%s %lld there, %lld here", flag.c_str(), (long long)it->second, (long long)value));
  }
  if (!differences.empty())
    throw UserError("checkpoint " + c.path + " holds another model: " + join(differences, "; ") +
                    "; run with the flags it was saved with");
}

// The checkpoint's optimizer state is this run's optimizer's, whole.
void check_optimizer_state(const mg::MegatronCheckpoint& c, const std::string& optimizer) {
  if (!c.optimizer_refusal.empty()) throw UserError(c.optimizer_refusal);
  if (c.optimizer.empty() || (c.optimizer == "adam" && !c.step))
    throw UserError("checkpoint " + c.path + " holds no optimizer state (saved with --no-save-optim); pass "
                    "--no-load-optim or --finetune to load only the weights");
  if (c.optimizer != optimizer)
    throw UserError("checkpoint " + c.path + " holds " + (c.optimizer == "sgd" ? "SGD's momentum" : "Adam's moments") +
                    ", this run uses --optimizer " + optimizer + ": run with --optimizer " + c.optimizer +
                    ", or pass --no-load-optim or --finetune to load only the weights");
}

// Every tensor this rank needs, present with its parameter's global shape, before anything is
// written; and nothing in the checkpoint that the model lacks.
void check_tensors(const mg::MegatronCheckpoint& c, const TrainingState& s, bool load_optim) {
  std::set<std::string> wanted;
  for (const auto& domain : s.optimizer.domains())
    for (const Slot& slot : domain->param_slots()) {
      const std::string name = checkpoint_name(slot);
      std::vector<std::string> prefixes = {""};
      if (load_optim)
        for (const auto& prefix : optimizer_state_prefixes(s.config.optimizer)) prefixes.push_back(prefix);
      for (const std::string& prefix : prefixes) {
        wanted.insert(prefix + name);
        auto it = c.tensors.find(prefix + name);
        if (it == c.tensors.end())
          throw UserError("checkpoint " + c.path + " lacks " + prefix + name +
                          (prefix.empty() ? "; was it saved for another model?" : "; pass --no-load-optim"));
        if (it->second.shape() != slot.info.global_shape)
          throw UserError("checkpoint " + c.path + ": " + prefix + name + " is " + shape_text(it->second.shape()) +
                          " there, " + shape_text(slot.info.global_shape) + " in this model; run with the model "
                          "flags it was saved with");
      }
    }
  // Persistent model buffers (the MoE routers' expert_bias), which Megatron stores as weights.
  for (const auto& [name, buffer] : s.buffers) {
    wanted.insert(name);
    auto it = c.tensors.find(name);
    if (it == c.tensors.end())
      throw UserError("checkpoint " + c.path + " lacks " + name + "; was it saved with the same MoE router flags "
                      "(--moe-router-enable-expert-bias)?");
    if (it->second.shape() != buffer.sizes().vec())
      throw UserError("checkpoint " + c.path + ": " + name + " is " + shape_text(it->second.shape()) + " there, " +
                      shape_text(buffer.sizes().vec()) + " in this model; run with the model flags it was saved with");
  }
  // Another pipeline stage's layers and another expert-parallel rank's experts are not this
  // rank's to load (the number of experts is compared with the saved run's).
  const bool other_experts = s.parallel.sizes.ep > 1;
  for (const auto& [name, tensor] : c.tensors)
    if (!wanted.count(name) && name.rfind("optimizer.", 0) != 0 && name.rfind(kTorchDistFp8StatePrefix, 0) != 0 &&
        s.parallel.sizes.pp == 1 &&
        !(other_experts && name.find(".mlp.experts.") != std::string::npos))
      throw UserError("checkpoint " + c.path + " holds " + name + ", which this model lacks; run with the model flags "
                      "it was saved with");
}

// The local elements [begin, end) of `slot` on this rank, read from the checkpoint's tensor.
torch::Tensor local_range(const mg::StoredTensor& stored, const Slot& slot, int tp_rank, int tp_size, int64_t begin,
                          int64_t end) {
  std::vector<torch::Tensor> parts;
  for (const Piece& piece : param_pieces(slot, tp_rank, tp_size))
    parts.push_back(stored.read(piece.box.offset, piece.box.shape).contiguous().view({-1}));
  return torch::cat(parts).narrow(0, begin, end - begin);
}

// One range of a parameter's buffer (the main weights or a moment) and the checkpoint's tensor it
// comes from.
struct RangeRead {
  const mg::StoredTensor* stored;
  const Slot* slot;
  int tp_rank, tp_size;
  int64_t begin, end;      // in the parameter
  torch::Tensor destination;
  torch::Tensor values;    // read, not yet written
};

std::vector<RangeRead> plan_reads(const mg::MegatronCheckpoint& c, const TrainingState& s, bool load_optim) {
  std::vector<RangeRead> reads;
  for (const auto& domain : s.optimizer.domains()) {
    OptimizerDomain& o = *domain;
    const auto states = load_optim ? optimizer_states_to_load(o, s.config.optimizer)
                                   : std::vector<std::pair<std::string, torch::Tensor>>{};
    const int64_t shard_begin = o.shard_begin(), shard_end = o.shard_begin() + o.shard_numel();
    const int tp_rank = o.groups().tp->rank(), tp_size = o.groups().tp->size();
    const torch::Tensor main_weights = o.main_params_to_load();
    // fp16 main weights: the model weights are read as saved too (OptimizerDomain::model_shard_to_load).
    const torch::Tensor model_weights = o.model_shard_to_load();
    for (const Slot& slot : o.param_slots()) {
      const int64_t lo = std::max(slot.offset, shard_begin), hi = std::min(slot.offset + slot.numel, shard_end);
      if (lo >= hi) continue;
      auto read = [&](const torch::Tensor& buffer, const std::string& name) {
        reads.push_back(RangeRead{&c.tensors.at(name), &slot, tp_rank, tp_size, lo - slot.offset, hi - slot.offset,
                                  buffer.narrow(0, lo - shard_begin, hi - lo), {}});
      };
      // The fp32 main weights of a bf16/fp16 checkpoint, as Megatron restores them with the
      // optimizer; otherwise (and without the optimizer) the weights themselves.
      const std::string main = std::string(kMainParamPrefix) + checkpoint_name(slot);
      read(main_weights, load_optim && c.tensors.count(main) ? main : checkpoint_name(slot));
      if (model_weights.defined()) read(model_weights, checkpoint_name(slot));
      if (!load_optim) continue;
      for (const auto& [prefix, buffer] : states) read(buffer, prefix + checkpoint_name(slot));
    }
  }
  // Stored tensor by stored tensor: each chunk of a tensor stacked over layers is read once.
  std::stable_sort(reads.begin(), reads.end(),
                   [](const RangeRead& a, const RangeRead& b) { return a.stored->source() < b.stored->source(); });
  return reads;
}

// Every rank reads the ranges it holds, and only those; nothing is written until every rank has
// read all of its ranges, so a damaged file leaves every rank's model as it was.
void copy_parameters(const mg::MegatronCheckpoint& c, const TrainingState& s, bool load_optim) {
  torch::NoGradGuard no_grad;
  std::vector<RangeRead> reads = plan_reads(c, s, load_optim);
  std::vector<std::pair<torch::Tensor, torch::Tensor>> buffers;  // (buffer, values read)
  std::vector<torch::Tensor> fp8_states;                            // by FP8 site
  std::string error;
  bool damaged = false;
  try {
    for (RangeRead& r : reads) r.values = local_range(*r.stored, *r.slot, r.tp_rank, r.tp_size, r.begin, r.end);
    for (const auto& [name, buffer] : s.buffers) buffers.emplace_back(buffer, c.tensors.at(name).read());
    // fp8tron's FP8 recipe state, where fp8tron wrote the checkpoint (Megatron's Transformer
    // Engine state in _extra_state is not read: TE's scaling is not fp8tron's).
    fp8_states = read_fp8_recipe_state(s, [&](const fp8::Fp8Site& site) {
      auto it = c.tensors.find(kTorchDistFp8StatePrefix + site.name);
      return it == c.tensors.end() ? torch::Tensor() : it->second.read();
    });
  } catch (const ck::DamagedCheckpoint& e) {
    error = e.what(), damaged = true;
  } catch (const std::exception& e) {
    error = e.what();
  }
  if (c.dcp) {
    c.dcp->forget_chunks();
    log::info(strprintf(" > read %.2f MB of the checkpoint's %.2f MB of tensors on this rank", c.dcp->bytes_read() / 1e6,
                        c.dcp->tensor_bytes() / 1e6));
  }
  if (c.legacy_tensor_reads)
    log::info(strprintf(" > read %.2f MB of the %.2f MB of tensors in model_optim_rng.pt files on this rank",
                        c.legacy_tensor_reads->read / 1e6, c.legacy_tensor_reads->stored / 1e6));
  if (c.legacy_optimizer_reads)
    log::info(strprintf(" > read %.2f MB of the distributed optimizer's %.2f MB in distrib_optim.pt on this rank",
                        c.legacy_optimizer_reads->read / 1e6, c.legacy_optimizer_reads->stored / 1e6));
  if (any_rank(s.parallel, s.device, !error.empty())) {
    if (damaged) throw ck::DamagedCheckpoint(error);
    throw UserError(!error.empty() ? error
                                   : "checkpoint " + c.path + " could not be read on another rank (its log says why); "
                                     "nothing was loaded");
  }
  for (RangeRead& r : reads) r.destination.copy_(r.values);
  for (auto& [buffer, values] : buffers) buffer.copy_(values);
  if (load_optim && c.step) s.optimizer.set_step_count(*c.step);  // SGD counts no steps
  s.optimizer.adopt_loaded_states();
  s.optimizer.publish_model_params();
  restore_fp8_recipe_state(s, fp8_states);
}

// The schedule to continue with: the checkpoint's against this run's, by Megatron's rules (a
// difference is refused unless a flag chooses).
LrScheduleConfig resolved_schedule(const mg::MegatronCheckpoint& c, const TrainingState& s) {
  const CheckpointConfig& k = s.config.checkpoint;
  if (!c.scheduler) return s.schedule.config();
  const mg::SchedulerValues& v = *c.scheduler;
  ck::SchedulerState saved;
  saved.max_lr = v.max_lr, saved.min_lr = v.min_lr, saved.lr_warmup_steps = v.lr_warmup_steps;
  saved.lr_decay_steps = v.lr_decay_steps, saved.lr_decay_style = v.lr_decay_style;
  saved.start_wd = v.start_wd, saved.end_wd = v.end_wd, saved.wd_incr_steps = v.wd_incr_steps;
  saved.wd_incr_style = v.wd_incr_style;
  const SchedulerSource source = k.override_opt_param_scheduler        ? SchedulerSource::kCommandLine
                                 : k.use_checkpoint_opt_param_scheduler ? SchedulerSource::kCheckpoint
                                                                        : SchedulerSource::kMustMatch;
  return resolve_schedule(s.schedule.config(), saved, source, c.path);
}

// Runs `checks` on every rank, then agrees: a refusal found on one rank only (another pipeline
// stage's tensors) stops every rank, each with one line, before anything is written.
void agree_before_loading(const TrainingState& s, const std::string& path, const std::function<void()>& checks) {
  std::string error;
  bool damaged = false;
  try {
    checks();
  } catch (const ck::DamagedCheckpoint& e) {
    error = e.what(), damaged = true;
  } catch (const UserError& e) {
    error = e.what();
  }
  if (!any_rank(s.parallel, s.device, !error.empty())) return;
  if (damaged) throw ck::DamagedCheckpoint(error);
  throw UserError(!error.empty() ? error
                                 : "checkpoint " + path + " does not fit this run on another rank (its log says why); "
                                   "nothing was loaded");
}

// fp8tron's own RNG states in a torch_dist checkpoint it wrote (mg::kFp8tronRngStateKey).
std::vector<ck::RngState> rng_states(const mg::MegatronCheckpoint& c) {
  std::vector<ck::RngState> out;
  for (const auto& r : c.fp8tron_rng) out.push_back(ck::RngState{r.rank, r.generator, r.state});
  return out;
}

ck::ParallelLayout rng_layout(const mg::MegatronCheckpoint& c) {
  const std::vector<int64_t>& v = c.fp8tron_rng_layout;
  if (v.size() != 8)
    throw UserError(c.path + ": the layout of fp8tron's RNG states has " + std::to_string(v.size()) + " entries, not 8");
  ck::ParallelLayout l;
  l.tp = int(v[0]), l.pp = int(v[1]), l.dp = int(v[2]), l.cp = int(v[3]), l.ep = int(v[4]), l.vpp = int(v[5]);
  l.world_size = int(v[6]), l.etp = int(v[7]);
  return l;
}

}  // namespace

int64_t load_megatron_checkpoint(const TrainingState& s, const ck::CheckpointLocation& location,
                                 const std::string& format) {
  const CheckpointConfig& k = s.config.checkpoint;
  const bool restart = k.finetune || location.release || location.finetune;
  const bool load_optim = k.load_optim && !restart;
  log::info(" > reading Megatron's " + format + " checkpoint " + location.path);
  std::optional<mg::MegatronCheckpoint> read;
  LrScheduleConfig schedule = s.schedule.config();
  agree_before_loading(s, location.path, [&] {
    const std::string& optimizer = s.config.optimizer.optimizer;
    if (load_optim && optimizer != "adam" && optimizer != "sgd")
      throw UserError("checkpoint " + location.path + " is Megatron's; fp8tron reads its Adam and SGD state only, this "
                      "run uses --optimizer " + optimizer + ": pass --no-load-optim or --finetune");
    // The weights whose optimizer state this rank reads (none without the optimizer): of the
    // distributed optimizer's buffers only their state is located.
    std::set<std::string> weights_read;
    if (load_optim)
      for (const auto& domain : s.optimizer.domains())
        for (const Slot& slot : domain->param_slots()) weights_read.insert(checkpoint_name(slot));
    read = mg::read_checkpoint(location.path, format, &weights_read);
    const mg::MegatronCheckpoint& c = *read;
    check_model_args(c, s.config.model);
    if (load_optim) check_optimizer_state(c, optimizer);
    check_tensors(c, s, load_optim);
    if (load_optim) schedule = resolved_schedule(c, s);
  });
  const mg::MegatronCheckpoint& c = *read;

  // Nothing above wrote to the model, the optimizer or the schedule.
  copy_parameters(c, s, load_optim);
  if (s.fp8) s.fp8->invalidate_weights();
  if (load_optim) {
    s.schedule.set_config(schedule);
    if (c.scheduler) s.schedule.set_num_steps(c.scheduler->num_steps);
    if (c.loss_scaler && s.config.precision.dynamic_loss_scale())
      s.scaler.restore(c.loss_scaler->scale, c.loss_scaler->growth_tracker, int(c.loss_scaler->hysteresis_tracker));
  }
  if (!restart) {
    s.consumed_train_samples = c.consumed_train_samples;
    s.consumed_valid_samples = c.consumed_valid_samples;
    if (!c.fp8tron_rng.empty() && k.load_rng) restore_rng_states(rng_states(c), rng_layout(c), s, c.path);
    else log::info(" > Megatron's RNG states are not restored: random streams continue from --seed");
  }
  barrier(s.parallel);
  const int64_t iteration = restart ? 0 : c.iteration;
  log::print(strprintf("  successfully loaded Megatron's %s checkpoint from %s at iteration %lld", format.c_str(),
                       location.path.c_str(), (long long)iteration));
  return iteration;
}

}  // namespace fp8tron
