#include "checkpoint/load.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <optional>
#include <set>

#include "core/error.h"
#include "core/log.h"
#include "core/text.h"
#include "fp8/fp8_linear.h"
#include "checkpoint/checkpoint_dir.h"
#include "checkpoint/fp8_recipe_state.h"
#include "checkpoint/load_megatron.h"
#include "checkpoint/megatron/damage.h"
#include "checkpoint/megatron/megatron_checkpoint.h"
#include "checkpoint/metadata.h"
#include "checkpoint/model_identity.h"
#include "checkpoint/other_iterations.h"
#include "checkpoint/rank_agreement.h"
#include "checkpoint/rng_state.h"
#include "checkpoint/saved_tensors.h"
#include "checkpoint/scheduler_state.h"
#include "checkpoint/sharded_io.h"
#include "optim/loss_scaler.h"
#include "optim/lr_schedule.h"

namespace fp8tron {
namespace ck = checkpoint;
namespace {

// Whether `slot` is a vocabulary tensor: rows = the padded vocabulary (the word embedding, an
// untied output layer, the last stage's copy of a tied one).
bool is_vocab_tensor(const Slot& slot, const ModelConfig& m) {
  const std::string name = checkpoint_name(slot);
  const auto& g = slot.info.global_shape;
  return g.size() == 2 && g[0] == m.padded_vocab_size &&
         (name == "embedding.word_embeddings.weight" || name == "output_layer.weight");
}

// Reads `box` of tensor `name` (this model's global shape `shape`). A vocabulary tensor saved
// with another vocabulary padding (another --make-vocab-size-divisible-by x tensor-parallel size)
// is read as far as the checkpoint has rows; the padding rows past them repeat the checkpoint's
// last row for weights (as Megatron's checkpoint converter pads) and are zero for optimizer
// moments. Real tokens' rows are the same in both: only padding is added or dropped.
void read_box(ck::CheckpointReader& reader, const std::string& name, ck::DType dtype, const ck::Shape& shape,
              const ck::Box& box, char* dst, bool vocab) {
  const auto& tensors = reader.metadata().tensors;
  auto it = tensors.find(name);
  if (!vocab || it == tensors.end() || it->second.shape.size() != 2 || it->second.shape[1] != shape[1] ||
      it->second.shape[0] == shape[0]) {
    reader.read(name, dtype, shape, box, dst);
    return;
  }
  const ck::Shape& saved = it->second.shape;
  const int64_t rows = box.shape[0], first = box.offset[0], row_bytes = box.shape[1] * int64_t(ck::dtype_size(dtype));
  const int64_t kept = std::clamp<int64_t>(saved[0] - first, 0, rows);
  if (kept > 0) reader.read(name, dtype, saved, ck::Box{box.offset, {kept, box.shape[1]}}, dst);
  if (kept == rows) return;
  char* padding = dst + kept * row_bytes;
  const bool repeat_last_row = name.rfind("optimizer.state.", 0) != 0 || name.rfind(kMainParamPrefix, 0) == 0;
  if (!repeat_last_row) {
    std::memset(padding, 0, size_t((rows - kept) * row_bytes));
    return;
  }
  reader.read(name, dtype, saved, ck::Box{{saved[0] - 1, box.offset[1]}, {1, box.shape[1]}}, padding);
  for (int64_t r = 1; r < rows - kept; ++r) std::memcpy(padding + r * row_bytes, padding, size_t(row_bytes));
}

// The elements [begin, end) of this rank's shard of a parameter (row-major in its local shape),
// read from checkpoint tensor `name` in the dtype it was saved in.
torch::Tensor read_local_range(ck::CheckpointReader& reader, const std::string& name, const Slot& slot,
                               const std::vector<Piece>& pieces, int64_t begin, int64_t end, bool vocab) {
  const auto& tensors = reader.metadata().tensors;
  auto it = tensors.find(name);
  const ck::DType dtype = it == tensors.end() ? ck::DType::F32 : it->second.dtype;  // missing: read() explains
  auto out = torch::empty({end - begin}, torch::TensorOptions().dtype(torch_dtype(dtype, name)));
  char* dst = static_cast<char*>(out.data_ptr());
  const int64_t element_size = int64_t(ck::dtype_size(dtype));
  for (const auto& piece : pieces) {
    const int64_t a = std::max(begin, piece.begin), b = std::min(end, piece.begin + piece.numel);
    if (a >= b) continue;
    int64_t at = a - begin;
    for (const auto& box : ck::flat_range_to_boxes(piece.box, a - piece.begin, b - piece.begin)) {
      read_box(reader, name, dtype, slot.info.global_shape, box, dst + at * element_size, vocab);
      at += ck::box_volume(box);
    }
  }
  return out;
}

// Megatron's --dist-ckpt-strictness, in its terms: "unexpected" tensors are ones this rank
// needs that the checkpoint lacks, "missing" ones are in the checkpoint but read by no rank.
struct Strictness {
  bool raise_unexpected = false;  // raise_*: one error listing them, before anything is read
  bool skip_unexpected = false;   // log_*, return_*, ignore_all: they keep their current values
  bool report = false;            // log_*, return_*: a warning lists the mismatches
  bool check_missing = false;     // *_all
  bool raise_missing = false;     // raise_all
};

Strictness strictness_of(const std::string& v) {
  Strictness s;
  if (v == "assume_ok_unexpected") return s;  // reading an absent tensor fails, naming it
  s.raise_unexpected = v == "raise_unexpected" || v == "raise_all";
  s.skip_unexpected = !s.raise_unexpected;
  s.report = v.rfind("log_", 0) == 0 || v.rfind("return_", 0) == 0;
  s.check_missing = v == "log_all" || v == "return_all" || v == "raise_all";
  s.raise_missing = v == "raise_all";
  return s;
}

std::string name_list(const std::set<std::string>& names) {
  std::vector<std::string> shown;
  for (const auto& n : names) {
    if (shown.size() == 8) {
      shown.push_back(strprintf("... (%zu in all)", names.size()));
      break;
    }
    shown.push_back(n);
  }
  return join(shown, ", ");
}

// Each read: checkpoint tensor -> this rank's range of a flat buffer of one optimizer domain.
struct Read {
  std::string name;
  const Slot* slot;
  torch::Tensor destination;
  int64_t begin, end;
  int tp_rank, tp_size;  // the domain's tensor-parallel partition
};

// The reads of one domain's parameters (and their optimizer state); `requested` also gets the
// model weights superseded by their fp32 copies (they are part of the model's state).
void plan_domain_reads(ck::CheckpointReader& reader, const TrainingState& s, OptimizerDomain& o, bool load_optim,
                       std::vector<Read>& reads, std::set<std::string>& requested) {
  // Main weights come from the fp32 copy when the optimizer state is loaded (exact resume) or
  // --load-main-params-from-ckpt asks; otherwise from the model weights, as Megatron does.
  const bool fp32_main = load_optim || s.config.checkpoint.load_main_params_from_ckpt;
  const auto states = load_optim ? optimizer_states_to_load(o, s.config.optimizer)
                                 : std::vector<std::pair<std::string, torch::Tensor>>{};
  const torch::Tensor main = o.main_params_to_load();
  // fp16 main weights: the model weights are read as saved too (OptimizerDomain::model_shard_to_load).
  const torch::Tensor model = o.model_shard_to_load();
  const int64_t shard_begin = o.shard_begin(), shard_end = o.shard_begin() + o.shard_numel();
  const int tp_rank = o.groups().tp->rank(), tp_size = o.groups().tp->size();
  for (const Slot& slot : o.param_slots()) {
    const int64_t lo = std::max(slot.offset, shard_begin), hi = std::min(slot.offset + slot.numel, shard_end);
    if (lo >= hi) continue;
    const std::string name = checkpoint_name(slot);
    const std::string source = fp32_main && reader.has_tensor(kMainParamPrefix + name) ? kMainParamPrefix + name : name;
    requested.insert(name);
    reads.push_back({source, &slot, main.narrow(0, lo - shard_begin, hi - lo), lo - slot.offset, hi - slot.offset, tp_rank,
                     tp_size});
    if (model.defined())
      reads.push_back({name, &slot, model.narrow(0, lo - shard_begin, hi - lo), lo - slot.offset, hi - slot.offset, tp_rank,
                       tp_size});
    if (!load_optim) continue;
    for (const auto& [prefix, buffer] : states) {
      const std::string state = state_name(prefix, slot, s.config.optimizer);
      if (state.empty()) continue;  // no such state for this parameter (a Muon matrix's second moment)
      reads.push_back({state, &slot, buffer.narrow(0, lo - shard_begin, hi - lo), lo - slot.offset, hi - slot.offset,
                       tp_rank, tp_size});
    }
  }
}

// Optimizer states saved in another dtype than this run stores them in (--exp-avg-dtype and
// --exp-avg-sq-dtype of the precision-aware optimizer) are converted as they are read: widened
// exactly, or rounded to nearest-even, as Transformer Engine's FusedAdam loads its states. Said
// once per state and dtype pair, by the first rank.
void report_state_conversions(ck::CheckpointReader& reader, const std::vector<Read>& reads, bool log_it) {
  std::set<std::string> said;
  for (const Read& r : reads) {
    if (r.name.rfind("optimizer.state.", 0) != 0 || r.name.rfind(kMainParamPrefix, 0) == 0) continue;
    const auto it = reader.metadata().tensors.find(r.name);
    if (it == reader.metadata().tensors.end() || it->second.dtype == checkpoint_dtype(r.destination.scalar_type())) continue;
    const std::string state = r.name.substr(0, r.name.find('.', std::string("optimizer.state.").size()));
    const std::string line = state + " is " + ck::dtype_name(it->second.dtype) + " in the checkpoint and " +
                             ck::dtype_name(checkpoint_dtype(r.destination.scalar_type())) + " in this run: converted";
    if (said.insert(line).second && log_it) log::info(" > " + line);
  }
}

void load_parameters(ck::CheckpointReader& reader, const TrainingState& s, bool load_optim) {
  MixedPrecisionOptimizer& o = s.optimizer;
  const ParallelState& p = s.parallel;
  const CheckpointConfig& k = s.config.checkpoint;
  const std::string& path = reader.location().path;
  torch::NoGradGuard no_grad;
  std::vector<Read> reads;
  std::set<std::string> requested;
  for (const auto& domain : o.domains()) plan_domain_reads(reader, s, *domain, load_optim, reads, requested);
  if (load_optim) requested.insert(kStepName);
  for (const Read& r : reads) requested.insert(r.name);
  for (const auto& [name, buffer] : s.buffers) requested.insert(name);

  const Strictness strict = strictness_of(k.dist_ckpt_strictness);
  std::set<std::string> unexpected, missing;
  for (const auto& n : requested)
    if (!reader.has_tensor(n)) unexpected.insert(n);
  if (strict.check_missing) {
    // Read by no rank: the union of every rank's requests, against the checkpoint's tensors.
    std::set<std::string> anyone(requested);
    const std::string mine = join(std::vector<std::string>(requested.begin(), requested.end()), "\n");
    for (const std::string& packed : all_gather_strings(p, s.device, mine)) {
      size_t at = 0;
      while (at < packed.size()) {
        const size_t stop = std::min(packed.find('\n', at), packed.size());
        anyone.insert(packed.substr(at, stop - at));
        at = stop + 1;
      }
    }
    for (const auto& [n, entry] : reader.metadata().tensors)
      if (!anyone.count(n)) missing.insert(n);
  }
  std::string error;
  if (strict.raise_unexpected && !unexpected.empty())
    error = "checkpoint " + path + " lacks tensors this model needs (--dist-ckpt-strictness " + k.dist_ckpt_strictness +
            "): " + name_list(unexpected);
  else if (strict.raise_missing && !missing.empty())
    error = "checkpoint " + path + " holds tensors this model does not read (--dist-ckpt-strictness raise_all): " +
            name_list(missing);
  if (any_rank(p, s.device, !error.empty()))
    throw UserError(!error.empty() ? error : "checkpoint " + path + " does not match the model (--dist-ckpt-strictness " +
                                                 k.dist_ckpt_strictness + "; another rank's log names the tensors)");
  if (strict.report && !unexpected.empty())
    log::warning("checkpoint " + path + " lacks tensors this model needs; they keep their initial values: " +
                 name_list(unexpected));
  if (strict.report && !missing.empty() && p.world_rank == 0)
    log::warning("checkpoint " + path + " holds tensors this model does not read: " + name_list(missing));

  report_state_conversions(reader, reads, p.world_rank == 0);
  for (const Read& r : reads) {
    if (strict.skip_unexpected && unexpected.count(r.name)) continue;
    const auto pieces = param_pieces(*r.slot, r.tp_rank, r.tp_size);
    const bool vocab = is_vocab_tensor(*r.slot, s.config.model);
    r.destination.copy_(read_local_range(reader, r.name, *r.slot, pieces, r.begin, r.end, vocab).to(torch::kFloat32));
  }
  for (const auto& [name, buffer] : s.buffers) {
    if (strict.skip_unexpected && unexpected.count(name)) continue;
    auto host = torch::empty({buffer.numel()}, torch::kFloat32);
    reader.read(name, ck::DType::F32, {buffer.numel()}, ck::whole({buffer.numel()}), host.data_ptr());
    torch::Tensor destination = buffer;
    destination.copy_(host.view(buffer.sizes()));
  }
  if (load_optim && !(strict.skip_unexpected && unexpected.count(kStepName))) {
    float step = 0;
    reader.read(kStepName, ck::DType::F32, {1}, ck::whole({1}), &step);
    o.set_step_count(step);
  }
  o.adopt_loaded_states();
  // Model weights = main weights in the parameter dtype (data-parallel all-gather with the
  // distributed optimizer), exactly what the step after the save published.
  o.publish_model_params();
  if (s.fp8) s.fp8->invalidate_weights();
}

// The FP8 state saved as `module`'s extra state (fp32, the shape it was saved with); undefined
// when the checkpoint has none.
torch::Tensor read_extra_state(ck::CheckpointReader& reader, const std::string& module) {
  const std::string name = module + kFp8StateSuffix;
  if (!reader.has_tensor(name)) return {};
  const auto& shape = reader.metadata().tensors.at(name).shape;
  auto state = torch::empty(shape, torch::kFloat32);
  reader.read(name, ck::DType::F32, shape, ck::whole(shape), state.data_ptr());
  return state;
}

// The FP8 scales and amax histories, so a resumed run quantizes with the scales it would have
// used. A checkpoint without them (bf16 run, or another recipe) starts the recipe afresh.
void load_fp8_state(ck::CheckpointReader& reader, const TrainingState& s) {
  restore_fp8_recipe_state(
      s, read_fp8_recipe_state(s, [&](const fp8::Fp8Site& site) { return read_extra_state(reader, site.name); }));
  if (!s.fp8) return;
  auto& attention = s.fp8->attention();
  int64_t missing = 0;
  for (const auto& site : attention.sites()) {
    const torch::Tensor state = read_extra_state(reader, site->name);
    if (state.defined()) attention.load_site_state(*site, state);
    missing += !state.defined();
  }
  if (missing > 0)
    log::info(strprintf(" > the checkpoint holds no FP8 attention scales for %lld layers: their first step calibrates "
                        "them, as in a new run", (long long)missing));
}


// The checkpoint --load (and --ckpt-step, and with --non-persistent-ckpt-type global the
// non-persistent directory) names, as Megatron chooses it: the non-persistent one when it is at
// least as new as the persistent one; nullopt: start from scratch.
struct ToLoad {
  std::string dir;  // --load, or the non-persistent directory
  ck::CheckpointLocation location;
};
std::optional<ToLoad> checkpoint_to_load(const CheckpointConfig& k) {
  std::optional<ck::Tracker> persistent = k.ckpt_step ? std::optional<ck::Tracker>(ck::Tracker{*k.ckpt_step, false})
                                                      : ck::read_tracker(k.load);
  if (k.non_persistent_global) {
    const std::string dir = ck::non_persistent_dir(k.non_persistent_dir, k.load);
    if (auto np = ck::read_tracker(dir)) {
      if (np->release) throw UserError(dir + ": a non-persistent checkpoint cannot be a release checkpoint");
      const int64_t persistent_iteration = !persistent ? -1 : persistent->release ? 0 : persistent->iteration;
      if (np->iteration >= persistent_iteration) return ToLoad{dir, ck::locate_latest_checkpoint(dir)};
      log::warning(strprintf("the non-persistent checkpoint in %s (iteration %lld) is older than the persistent one; "
                             "loading the persistent one", dir.c_str(), (long long)np->iteration));
    } else {
      log::info(" > no non-persistent checkpoint in " + dir);
    }
  }
  if (k.ckpt_step) return ToLoad{k.load, ck::locate_checkpoint(k.load, *k.ckpt_step)};
  if (!persistent) {
    const std::string tracker = k.load + "/" + ck::kTrackerFileName;
    std::string found;
    for (int64_t it : ck::list_checkpoint_iterations(k.load)) found += (found.empty() ? "" : ", ") + std::to_string(it);
    const std::string hint = found.empty() ? "" : " (complete checkpoints for iterations " + found +
                                                      " are there: --ckpt-step N loads one)";
    if (k.exit_on_missing_checkpoint)
      throw UserError("--load " + k.load + ": no checkpoint to load, " + tracker + " is missing" + hint +
                      "; exiting as --exit-on-missing-checkpoint asks");
    log::warning("could not find the metadata file " + tracker + hint +
                 "; will not load any checkpoints and will start from random");
    return std::nullopt;
  }
  return ToLoad{k.load, ck::locate_latest_checkpoint(k.load)};
}


// --pretrained-checkpoint, --load holding none: its latest checkpoint (or --ckpt-step's), to be
// loaded as --finetune loads.
std::optional<ToLoad> pretrained_to_load(const CheckpointConfig& k) {
  log::print("Checkpoint file not found in load directory " + (k.load.empty() ? std::string("(none)") : k.load) +
             " attempting to finetune with checkpoint in " + k.pretrained);
  if (!k.ckpt_step && !ck::read_tracker(k.pretrained))
    throw UserError("--pretrained-checkpoint " + k.pretrained + " holds no checkpoint (" + k.pretrained + "/" +
                    ck::kTrackerFileName + " is missing), and --load " + (k.load.empty() ? "is not given" : "holds none") +
                    ": no checkpoint found in the load directory or the pretrained directory");
  ToLoad t{k.pretrained, k.ckpt_step ? ck::locate_checkpoint(k.pretrained, *k.ckpt_step)
                                     : ck::locate_latest_checkpoint(k.pretrained)};
  t.location.finetune = true;
  return t;
}

// --override-ckpt-iteration: the loaded run continues from `iteration`, the data loader replaying
// the samples from there (Megatron's consumed samples: iteration x global batch size).
int64_t override_iteration(const TrainingState& s, int64_t iteration) {
  s.consumed_train_samples = iteration * s.config.training.global_batch_size;
  if (s.skipped_train_samples) *s.skipped_train_samples = 0;
  log::print(strprintf("--override-ckpt-iteration: start at iteration %lld (consumed_train_samples %lld)",
                       (long long)iteration, (long long)s.consumed_train_samples));
  return iteration;
}

bool same_directory(const std::string& a, const std::string& b) {
  std::error_code ea, eb;
  const auto ca = std::filesystem::weakly_canonical(a, ea), cb = std::filesystem::weakly_canonical(b, eb);
  return !ea && !eb ? ca == cb : a == b;
}

// A run writes into --save only to continue what is there: one that did not resume from --save
// would overwrite its checkpoints and move its tracker back to its own iterations.
void refuse_overwriting_another_run(const CheckpointConfig& k, const std::optional<ToLoad>& loaded) {
  if (k.save.empty() || (loaded && same_directory(loaded->dir, k.save))) return;
  std::string held;
  for (int64_t it : ck::list_checkpoint_iterations(k.save)) held += (held.empty() ? "" : ", ") + std::to_string(it);
  if (held.empty()) return;
  const bool resumable = !k.load.empty() && same_directory(k.load, k.save);
  throw UserError("--save " + k.save + " holds the checkpoints of another run (iterations " + held + ") that this run " +
                  (loaded ? "did not resume from" : "would overwrite from scratch") + "; " +
                  (resumable ? "resume one with --ckpt-step N"
                             : "resume it with --load " + k.save + " (and --ckpt-step N for an older one)") +
                  ", or start over in a new --save directory");
}


int64_t load_found(const TrainingState& s, const ToLoad& found) {
  const CheckpointConfig& k = s.config.checkpoint;
  const ParallelState& p = s.parallel;
  const ck::CheckpointLocation& location = found.location;
  const std::string& from = found.dir;
  log::print(strprintf("loading checkpoint from %s at iteration %lld", from.c_str(), (long long)location.iteration));
  std::error_code ec;
  if (!std::filesystem::exists(location.path + "/" + ck::kMetadataFileName, ec)) {
    // Not fp8tron's own format: one of Megatron's, read as Megatron would read it.
    const std::string format = ck::megatron::detect_format(location.path);
    if (!format.empty()) {
      const std::string refusal = ck::megatron::format_refusal(format, k.ckpt_format, k.auto_detect_ckpt_format,
                                                               location.path);
      if (!refusal.empty()) throw UserError(refusal);
      return load_megatron_checkpoint(s, location, format);
    }
  }
  ck::CheckpointReader reader(location, k.verify_checksums);
  const ck::CheckpointMetadata& m = reader.metadata();
  check_model(m, s.config, location.path);
  const ck::ParallelLayout here = layout_of(s);
  if (!(m.parallel == here))
    log::info(" > resharding: the checkpoint was saved with " + layout_string(m.parallel) + ", this run uses " +
              layout_string(here));

  const bool restart = k.finetune || location.release || location.finetune;  // weights only, counters from zero
  const bool load_optim = k.load_optim && !restart;
  if (load_optim) {
    if (!reader.has_tensor(kStepName))
      throw UserError("checkpoint " + location.path + " holds no optimizer state (saved with --no-save-optim); pass "
                      "--no-load-optim or --finetune to load only the weights");
    auto saved = m.args.find("optimizer");
    if (saved != m.args.end() && saved->second != s.config.optimizer.optimizer)
      throw UserError("checkpoint " + location.path + " was saved with --optimizer " + saved->second +
                      " but this run uses " + s.config.optimizer.optimizer +
                      "; pass --no-load-optim to start the optimizer afresh");
  }
  load_parameters(reader, s, load_optim);
  load_fp8_state(reader, s);  // part of the model state, as TE's extra state (also with --finetune)
  if (load_optim) {
    if (m.lr_scheduler) {
      const SchedulerSource source = k.override_opt_param_scheduler        ? SchedulerSource::kCommandLine
                                     : k.use_checkpoint_opt_param_scheduler ? SchedulerSource::kCheckpoint
                                                                            : SchedulerSource::kMustMatch;
      s.schedule.set_config(resolve_schedule(s.schedule.config(), *m.lr_scheduler, source, location.path));
    } else {
      log::info(" > the checkpoint does not record its learning-rate schedule (an older fp8tron saved it): this "
                "run's schedule is used");
    }
    s.schedule.set_num_steps(m.lr_scheduler_num_steps);
    s.scaler.restore(m.loss_scaler.scale, m.loss_scaler.growth_tracker, int(m.loss_scaler.hysteresis_tracker));
  }
  if (!restart) {
    s.consumed_train_samples = m.consumed_train_samples;
    s.consumed_valid_samples = m.consumed_valid_samples;
    if (s.skipped_train_samples) *s.skipped_train_samples = m.skipped_train_samples;
    if (s.rerun && m.rerun) {
      s.rerun->loaded = m.rerun;
      s.rerun->loaded_same_layout = m.parallel == here;
    }
    if (k.load_rng) restore_rng(m, s, location.path);
  }
  if (!k.verify_checksums)
    log::info(" > checkpoint checksums not verified (--no-verify-integrity)");
  else if (reader.has_checksums())
    log::info(strprintf(" > verified the checksums of the %lld stored tensors this rank read",
                        (long long)reader.tensors_verified()));
  else
    log::info(" > the checkpoint records no checksums (an older fp8tron saved it): its tensors are not verified");
  reader.close_files();
  barrier(p);
  const int64_t iteration = restart ? 0 : m.iteration;
  log::print(strprintf("  successfully loaded checkpoint from %s [ t %d/%d, p %d/%d ] at iteration %lld", from.c_str(),
                      p.tp_rank + 1, p.sizes.tp, p.pp_rank + 1, p.sizes.pp, (long long)iteration));
  return iteration;
}

}  // namespace

int64_t load_checkpoint(const TrainingState& s) {
  const CheckpointConfig& k = s.config.checkpoint;
  std::optional<ToLoad> found;
  // Megatron's rule: --pretrained-checkpoint is the start of a fine-tuning run whose --load holds
  // no checkpoint yet; once --load holds one, the run resumes from it.
  const bool from_pretrained = !k.pretrained.empty() && (k.load.empty() || !ck::read_tracker(k.load));
  const std::string& dir = from_pretrained ? k.pretrained : k.load;
  try {
    if (from_pretrained) found = pretrained_to_load(k);
    else if (!k.load.empty()) found = checkpoint_to_load(k);
  } catch (const ck::DamagedCheckpoint& e) {
    throw UserError(ck::with_other_iterations(e.what(), dir, -1));
  }
  refuse_overwriting_another_run(k, found);
  if (!found) return 0;
  // Whatever part of the checkpoint is damaged or unreadable, the refusal says what else to load.
  int64_t iteration = 0;
  try {
    iteration = load_found(s, *found);
  } catch (const ck::DamagedCheckpoint& e) {
    throw UserError(ck::with_other_iterations(e.what(), found->dir, found->location.iteration));
  }
  return k.override_iteration ? override_iteration(s, *k.override_iteration) : iteration;
}

}  // namespace fp8tron
