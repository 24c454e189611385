#include "checkpoint/save.h"

#include <algorithm>
#include <map>
#include <utility>

#include "core/error.h"
#include "core/log.h"
#include "core/text.h"
#include "core/version.h"
#include "fp8/fp8_linear.h"
#include "checkpoint/checksum.h"
#include "checkpoint/fault_points.h"
#include "checkpoint/model_identity.h"
#include "checkpoint/rank_agreement.h"
#include "checkpoint/rng_state.h"
#include "checkpoint/saved_tensors.h"
#include "checkpoint/scheduler_state.h"
#include "checkpoint/sharded_io.h"
#include "optim/loss_scaler.h"
#include "optim/lr_schedule.h"

namespace fp8tron {
namespace ck = checkpoint;

using Clock = std::chrono::steady_clock;

// This rank's shard file: the writer points into host copies of the buffers kept here.
struct RankShards {
  explicit RankShards(int rank) : writer(ck::rank_file_name(rank)) {}
  ck::RankShardWriter writer;
  std::vector<torch::Tensor> host_buffers;
  float step = 0;
};

PendingSave::PendingSave() = default;
PendingSave::~PendingSave() = default;

namespace {

// The part of a buffer replicated over the ranks of `holders` that this rank writes: all of it on
// the group's rank 0 only, or with fully parallel saves (Megatron's default) an equal part on every
// rank of the group.
std::pair<int64_t, int64_t> replica_part(const TrainingState& s, const Communicator& holders, int64_t numel) {
  const int dp = holders.size(), r = holders.rank();
  if (!s.config.checkpoint.fully_parallel_save || dp == 1) return {0, r == 0 ? numel : 0};
  const int64_t part = (numel + dp - 1) / dp;
  return {std::min(numel, r * part), std::min(numel, (r + 1) * part)};
}

// The host bytes of a source's elements [begin, end).
struct HostRange {
  torch::Tensor host;  // 1-D, contiguous, on the CPU
  int64_t begin = 0;
  const char* at(int64_t element, int64_t count) const {
    FP8TRON_CHECK(element >= begin && element + count <= begin + host.numel(),
                  "a checkpoint tensor lies outside the host copy of its buffer");
    return bytes_at(host, element - begin);
  }
};

// Host copies of the sources' ranges. Synchronous saves (`snapshot` null) read CPU buffers in
// place (training waits) and copy GPU ones to pageable memory; asynchronous ones copy into the
// reusable snapshot buffers, which training does not touch.
std::vector<HostRange> host_ranges(const std::vector<SaveSource>& sources, SnapshotBuffers* snapshot,
                                   std::vector<torch::Tensor>& keep, int64_t* bytes_copied) {
  torch::NoGradGuard no_grad;
  std::vector<HostRange> out;
  for (size_t i = 0; i < sources.size(); ++i) {
    const SaveSource& src = sources[i];
    const torch::Tensor range = src.buffer.detach().narrow(0, src.begin, src.end - src.begin);
    torch::Tensor host;
    if (!snapshot) {
      host = range.to(torch::kCPU).contiguous();
    } else {
      host = snapshot->get(i, range.numel(), range.scalar_type(), pin_device(range));
      if (range.numel() > 0) host.copy_(range);
      *bytes_copied += range.numel() * int64_t(range.element_size());
    }
    keep.push_back(host);
    out.push_back(HostRange{host, src.begin});
  }
  return out;
}

// The flat-buffer index of a source's element 0: the model weights span the domain's whole buffer
// unless they are sharded (optim_grads_params), the optimizer's buffers only this rank's shard
// with the distributed optimizer.
int64_t source_base(const OptimizerDomain& o, bool model_weights) {
  const bool shard = model_weights ? o.params_sharded() : o.distributed();
  return shard ? o.shard_begin() : 0;
}

// One domain's parameters: tensor-parallel shards as boxes, distributed-optimizer shards as flat
// ranges, replicas once.
void collect_domain(const TrainingState& s, size_t di, const std::vector<SaveSource>& sources,
                    const std::vector<HostRange>& host, RankShards& out) {
  const OptimizerDomain& o = *s.optimizer.domains()[di];
  const int tp = o.groups().tp->size(), tp_rank = o.groups().tp->rank(), dp = o.groups().dp->size();
  for (const Slot& slot : o.param_slots()) {
    if (slot.info.shared_embedding_copy) continue;              // stored by the first stage
    if (slot.info.partition_dim < 0 && tp_rank != 0) continue;  // replicated over TP: rank 0 stores it
    const auto& g = slot.info.global_shape;
    const auto pieces = param_pieces(slot, tp_rank, tp);
    const int replicas = dp * (slot.info.partition_dim < 0 ? tp : 1);
    bool model_weights = true;  // the domain's first source
    for (size_t i = 0; i < sources.size(); ++i) {
      const SaveSource& src = sources[i];
      if (src.domain != di) continue;
      const std::string name = state_name(src.prefix, slot, s.config.optimizer);
      const ck::DType dtype = checkpoint_dtype(src.buffer.scalar_type());
      const bool replicated = !(model_weights ? o.params_sharded() : o.distributed());  // over data-parallel ranks
      const int64_t base = source_base(o, model_weights);
      const int64_t lo = base + src.begin, hi = base + src.end;    // what this rank writes, in flat-buffer indices
      model_weights = false;
      if (name.empty()) continue;  // no such state for this parameter (a Muon matrix's second moment)
      for (const auto& piece : pieces) {
        const int64_t first = slot.offset + piece.begin;
        const int64_t a = std::max(lo, first), b = std::min(hi, first + piece.numel);
        if (a >= b) continue;
        if (replicated && a == first && b == first + piece.numel)
          out.writer.add(name, dtype, g, piece.box, host[i].at(a - base, b - a), replicas);
        else  // a distributed-optimizer shard, or this rank's part of a replica cut by the split
          out.writer.add_flat_range(name, dtype, g, piece.box, a - first, b - first, host[i].at(a - base, b - a));
      }
    }
  }
}

// A replicated host tensor, stored once: kept alive with the shard's buffers.
void add_replicated(RankShards& out, const std::string& name, const torch::Tensor& host, int replicas) {
  out.host_buffers.push_back(host);
  out.writer.add(name, ck::DType::F32, {host.numel()}, ck::whole({host.numel()}), host.data_ptr(), replicas);
}

std::unique_ptr<RankShards> collect_shards(const TrainingState& s, SnapshotBuffers* snapshot, int64_t* bytes_copied) {
  s.optimizer.finish_param_gather();  // --overlap-param-gather: the model weights must be complete
  const MixedPrecisionOptimizer& o = s.optimizer;
  const ParallelState& p = s.parallel;
  const int tp = p.sizes.tp, dp = p.sizes.dp;
  auto out = std::make_unique<RankShards>(p.world_rank);
  const std::vector<SaveSource> sources = save_sources(s);
  const std::vector<HostRange> host = host_ranges(sources, snapshot, out->host_buffers, bytes_copied);
  for (size_t di = 0; di < o.domains().size(); ++di) collect_domain(s, di, sources, host, *out);
  // FP8 recipe state: the same on every rank of a site's amax group (tensor x data parallel; an
  // expert's expert tensor x expert data parallel), so the first of them stores it.
  const OptimizerDomain* experts = o.domains().size() > 1 ? o.domains()[1].get() : nullptr;
  if (s.fp8) {
    for (const auto& site : s.fp8->sites()) {
      if (!stores_fp8_state(s, *site, false)) continue;
      const bool expert = experts && experts->holds(site->parameter);
      const torch::Tensor state = s.fp8->site_state(*site);
      if (!state.defined()) continue;
      add_replicated(*out, site->name + kFp8StateSuffix, state,
                     expert ? p.sizes.etp * p.sizes.edp : tp * dp);
    }
    // FP8 attention's amaxes (fp8/attention_scaling.h), as the core attention's extra state.
    if (p.tp_rank == 0 && p.dp_rank == 0)
      for (const auto& site : s.fp8->attention().sites())
        add_replicated(*out, site->name + kFp8StateSuffix, s.fp8->attention().site_state(*site), tp * dp);
  }
  // Persistent model buffers (the routers' expert biases): the same on every rank of a stage.
  if (p.tp_rank == 0 && p.dp_rank == 0)
    for (const auto& [name, buffer] : s.buffers) add_replicated(*out, name, buffer.detach().to(torch::kCPU, torch::kFloat32).contiguous(), tp * dp);
  if (s.config.checkpoint.save_optim && p.world_rank == 0) {
    out->step = float(o.step_count());
    out->writer.add(kStepName, ck::DType::F32, {1}, ck::whole({1}), &out->step);
  }
  return out;
}

// The first saved tensor holding NaN or inf, by its checkpoint name (e.g.
// "optimizer.state.exp_avg.decoder.layers.0.mlp.linear_fc1.weight"); "" when this rank's part of
// the state is finite. One reduction per buffer; parameters are searched only when one fails.
std::string first_nonfinite(const TrainingState& s, const std::vector<SaveSource>& sources) {
  torch::NoGradGuard no_grad;
  for (const SaveSource& src : sources) {
    const torch::Tensor buffer = src.buffer.detach();
    if (src.end <= src.begin || torch::isfinite(buffer.narrow(0, src.begin, src.end - src.begin)).all().item<bool>())
      continue;
    const OptimizerDomain& o = *s.optimizer.domains()[src.domain];
    const int64_t base = source_base(o, src.prefix.empty());
    for (const Slot& slot : o.param_slots()) {
      const int64_t lo = std::max(slot.offset, base + src.begin), hi = std::min(slot.offset + slot.numel, base + src.end);
      if (lo < hi && !torch::isfinite(buffer.narrow(0, lo - base, hi - lo)).all().item<bool>()) return src.prefix + slot.name;
    }
    return src.prefix + "(padding)";
  }
  return "";
}

// Every stored tensor's checksum, as "key\tchecksum" lines (gathered to rank 0 at finalize).
std::string checksum_lines(const std::vector<std::string>& keys, const std::vector<uint64_t>& checksums) {
  FP8TRON_CHECK(keys.size() == checksums.size(), "one checksum per stored tensor");
  std::string out;
  for (size_t i = 0; i < keys.size(); ++i) out += keys[i] + "\t" + ck::checksum_hex(checksums[i]) + "\n";
  return out;
}

// Rank 0: records each rank's checksums (`lines[rank]`) in the tensor table's shard entries.
void add_checksums(ck::CheckpointMetadata& m, const std::vector<std::string>& lines) {
  std::map<std::pair<std::string, std::string>, uint64_t> by_key;  // (file, key)
  for (size_t rank = 0; rank < lines.size(); ++rank) {
    const std::string file = ck::rank_file_name(int(rank));
    size_t at = 0;
    while (at < lines[rank].size()) {
      const size_t tab = lines[rank].find('\t', at), end = lines[rank].find('\n', at);
      FP8TRON_CHECK(tab != std::string::npos && end != std::string::npos && tab < end, "malformed checksum line");
      const auto sum = ck::parse_checksum_hex(std::string_view(lines[rank]).substr(tab + 1, end - tab - 1));
      FP8TRON_CHECK(sum.has_value(), "malformed checksum");
      by_key[{file, lines[rank].substr(at, tab - at)}] = *sum;
      at = end + 1;
    }
  }
  for (auto& [name, tensor] : m.tensors)
    for (auto& shard : tensor.shards) {
      auto it = by_key.find({shard.file, shard.key});
      FP8TRON_CHECK(it != by_key.end(), "no checksum for " + shard.key + " in " + shard.file);
      shard.checksum = it->second;
    }
}

// Rank 0's metadata for the checkpoint, from every rank's packed (tensor table, RNG states).
ck::CheckpointMetadata build_metadata(const TrainingState& s, int64_t iteration, const std::vector<std::string>& packed) {
  ck::CheckpointMetadata m;
  m.iteration = iteration;
  m.consumed_train_samples = s.consumed_train_samples;
  m.consumed_valid_samples = s.consumed_valid_samples;
  if (s.skipped_train_samples) m.skipped_train_samples = *s.skipped_train_samples;
  if (s.rerun) m.rerun = s.rerun->to_save;
  // The data loaders are positioned by the samples consumed (Megatron's sampler).
  m.data_loader = {{"train_consumed_samples", s.consumed_train_samples},
                   {"valid_consumed_samples", s.consumed_valid_samples}};
  m.parallel = layout_of(s);
  for (const auto& [name, value] : s.config.resolved_flags) m.args[name] = value;
  for (const auto& f : model_fields(s.config.model)) m.args["model." + f.key] = f.value;
  m.fp8tron_version = fp8tron_version();
  m.fp8tron_commit = fp8tron_commit();
  m.lr_scheduler_num_steps = s.schedule.num_steps();
  m.lr_scheduler = scheduler_state(s.schedule.config());
  m.loss_scaler = ck::LossScalerState{s.scaler.scale(), s.scaler.growth_tracker(), s.scaler.hysteresis_tracker()};
  for (size_t rank = 0; rank < packed.size(); ++rank) {
    const auto fields = unpack(packed[rank]);
    FP8TRON_CHECK(!fields.empty() && fields.size() % 2 == 1, "malformed shard description");
    ck::merge_tensor_tables(m.tensors, ck::parse_tensor_table(fields[0], ck::rank_file_name(int(rank))));
    for (size_t i = 1; i + 1 < fields.size(); i += 2) m.rng.push_back(ck::RngState{int(rank), fields[i], fields[i + 1]});
  }
  return m;
}

// Removes the committed checkpoint of `iteration` in `dir` (renamed aside first, so a kill cannot
// leave half of it under its name; a failure is logged; a symbolic link is left alone, as
// Megatron does).
void delete_checkpoint(const std::string& dir, int64_t iteration, const std::string& token) {
  switch (ck::delete_checkpoint(dir, iteration, token)) {
    case ck::DeleteResult::kDeleted:
      log::info(strprintf("  successfully deleted checkpoint from iteration %7lld at %s", (long long)iteration, dir.c_str()));
      break;
    case ck::DeleteResult::kSymlink:
      log::info(strprintf("  skipping deleting checkpoint from iteration %7lld at %s since it is a symbolic link",
                          (long long)iteration, dir.c_str()));
      break;
    case ck::DeleteResult::kMissing: break;
    case ck::DeleteResult::kFailed:
      log::warning(strprintf("could not delete all of the checkpoint of iteration %lld at %s (the next save retries)",
                             (long long)iteration, dir.c_str()));
      break;
  }
}

}  // namespace

void fail_save_together(const ParallelState& p, const torch::Device& device, const ck::SaveTarget& target,
                        const std::string& error) {
  if (!any_rank(p, device, !error.empty())) return;
  if (p.world_rank == 0) ck::abort_save(target);
  throw UserError(!error.empty() ? error
                                 : strprintf("saving the checkpoint of iteration %lld to %s failed on another rank "
                                             "(its error is in its log)",
                                             (long long)target.iteration, target.save_dir.c_str()));
}

void retire_after_commit(const CheckpointConfig& k, const ck::SaveTarget& t, bool non_persistent, bool for_rerun,
                         std::optional<ck::Tracker> previous) {
  if (non_persistent) {
    for (int64_t it : ck::list_checkpoint_iterations(t.save_dir))
      if (it < t.iteration) delete_checkpoint(t.save_dir, it, t.token);
    return;
  }
  // A fault's checkpoint never retires the checkpoint saved before the fault: if the re-run is
  // not possible, that one is the way back.
  if (for_rerun) {
    if (previous && !previous->release && previous->iteration < t.iteration)
      log::print(strprintf("  kept the checkpoint of iteration %lld at %s: the last one saved before the fault",
                           (long long)previous->iteration, t.save_dir.c_str()));
    return;
  }
  if (k.save_retain_interval && previous && !previous->release && previous->iteration > 0 &&
      previous->iteration < t.iteration && previous->iteration % *k.save_retain_interval != 0)
    delete_checkpoint(t.save_dir, previous->iteration, t.token);
}

// Distributed-optimizer shards are written by the ranks holding them (one per optimizer instance),
// replicas over data-parallel ranks once (replica_part).
std::vector<SaveSource> save_sources(const TrainingState& s) {
  std::vector<SaveSource> sources;
  for (size_t di = 0; di < s.optimizer.domains().size(); ++di) {
    const OptimizerDomain& o = *s.optimizer.domains()[di];
    const torch::Tensor model = o.model_params();
    // Sharded weights (optim_grads_params) are held like the optimizer's shards, once per instance.
    const auto [first, last] = replica_part(s, o.params_sharded() ? *o.groups().instances : *o.groups().dp, model.numel());
    sources.push_back({"", model, first, last, di});
    if (!s.config.checkpoint.save_optim) continue;
    auto add = [&](const std::string& prefix, const torch::Tensor& buffer) {
      // A distributed-optimizer shard is held by one rank per optimizer instance.
      const Communicator& holders = o.distributed() ? *o.groups().instances : *o.groups().dp;
      const auto [a, b] = replica_part(s, holders, buffer.numel());
      sources.push_back({prefix, buffer, a, b, di});
    };
    // fp32 model weights are the main weights, unless --fp8-param-gather made some FP8.
    if (model.scalar_type() != torch::kFloat32 || o.byte_published()) add(kMainParamPrefix, o.main_params_to_save());
    for (const auto& [prefix, buffer] : optimizer_states_to_save(o, s.config.optimizer)) add(prefix, buffer);
  }
  return sources;
}

int pin_device(const torch::Tensor& t) { return t.is_cuda() ? int(t.device().index()) : -1; }

std::unique_ptr<PendingSave> prepare_save(const TrainingState& s, int64_t iteration, bool non_persistent,
                                          SnapshotBuffers* snapshot) {
  const CheckpointConfig& k = s.config.checkpoint;
  const ParallelState& p = s.parallel;
  auto save = std::make_unique<PendingSave>();
  save->start = Clock::now();
  save->non_persistent = non_persistent;
  save->for_rerun = s.rerun != nullptr && s.rerun->to_save.has_value();
  const std::string dir = non_persistent ? ck::non_persistent_dir(k.non_persistent_dir, k.save) : k.save;
  log::print(strprintf("saving %scheckpoint at iteration %7lld to %s in fp8tron format", non_persistent ? "non-persistent " : "",
                      (long long)iteration, dir.c_str()));
  save->target = ck::SaveTarget{dir, iteration, false, agree_on_token(p, s.device)};
  const std::string nonfinite = first_nonfinite(s, save_sources(s));
  if (!nonfinite.empty())
    save->error = strprintf("refusing to save the checkpoint of iteration %lld: '%s' holds NaN or inf (the run has "
                            "diverged); the previous checkpoint stays the latest",
                            (long long)iteration, nonfinite.c_str());
  const auto copy_start = Clock::now();
  save->shards = collect_shards(s, snapshot, &save->bytes_copied);
  save->copy_seconds = std::chrono::duration<double>(Clock::now() - copy_start).count();
  // Rank 0 gathers every rank's tensor table and RNG states for the metadata.
  std::vector<std::string> fields = {ck::serialize_tensor_table(save->shards->writer.table())};
  if (k.save_rng) {
    const std::vector<std::string> rng = generator_fields(s.device);
    fields.insert(fields.end(), rng.begin(), rng.end());
  }
  const std::vector<std::string> packed = all_gather_strings(p, s.device, pack(fields));
  try {
    if (p.world_rank == 0) save->metadata = build_metadata(s, iteration, packed);
    ck::begin_save(save->target);
  } catch (const UserError& e) {
    if (save->error.empty()) save->error = e.what();
  }
  return save;
}

// Every rank's shard file into the temporary directory, with the checksum of each stored tensor.
// No collectives, no torch: safe on a background thread.
void write_shards(PendingSave& save) noexcept {
  if (!save.error.empty()) return;
  try {
    const ck::RankShardWriter& writer = save.shards->writer;
    const ck::WriteStats stats = writer.write(ck::temp_dir_path(save.target));
    save.bytes = stats.bytes;
    save.checksums = checksum_lines(writer.keys(), stats.checksums);
    ck::fault_point("save:shard-written");
  } catch (const std::exception& e) {
    save.error = e.what();
  }
}

// Every rank: agree that all files are there, rank 0 commits, all learn the outcome.
void finalize_save(const TrainingState& s, PendingSave& save) {
  const ParallelState& p = s.parallel;
  save.shards.reset();
  fail_save_together(p, s.device, save.target, save.error);
  // The metadata goes in last: it carries every rank's checksums, known once all files are written.
  const std::vector<std::string> checksums = all_gather_strings(p, s.device, save.checksums);
  std::optional<ck::Tracker> previous;
  if (p.world_rank == 0) {
    try {
      previous = ck::read_tracker(save.target.save_dir);
    } catch (const UserError&) {
      // a garbage tracker is replaced by the commit; nothing to retain or delete
    }
    try {
      add_checksums(*save.metadata, checksums);
      ck::write_metadata(ck::temp_dir_path(save.target), *save.metadata);
      ck::fault_point("save:metadata-written");
      ck::CommitOptions commit;
      commit.hook = [](ck::CommitStep step) {
        std::string name = std::string("commit:") + ck::commit_step_name(step);
        std::replace(name.begin(), name.end(), ' ', '-');
        ck::fault_point(name);
      };
      for (int r = 0; r < p.sizes.world_size; ++r) commit.expected_files.push_back(ck::rank_file_name(r));
      commit.expected_files.push_back(ck::kMetadataFileName);
      commit.expected_file_count = int64_t(commit.expected_files.size());
      ck::commit_save(save.target, commit);
    } catch (const UserError& e) {
      save.error = e.what();
    }
  }
  fail_save_together(p, s.device, save.target, save.error);
  const double seconds = std::chrono::duration<double>(Clock::now() - save.start).count();
  log::print(strprintf("  successfully saved checkpoint from iteration %7lld to %s [ t %d/%d, p %d/%d ]",
                      (long long)save.target.iteration, save.target.save_dir.c_str(), p.tp_rank + 1, p.sizes.tp,
                      p.pp_rank + 1, p.sizes.pp));
  log::info(strprintf("  checkpoint save took %.2f s (rank 0 wrote %.1f MB, %.2f GB/s)", seconds, double(save.bytes) / 1e6,
                      double(save.bytes) / 1e9 / std::max(seconds, 1e-9)));
  if (p.world_rank == 0) retire_after_commit(s.config.checkpoint, save.target, save.non_persistent, save.for_rerun, previous);
}

void save_checkpoint(const TrainingState& s, int64_t iteration, bool non_persistent) {
  std::unique_ptr<PendingSave> save = prepare_save(s, iteration, non_persistent, nullptr);
  write_shards(*save);
  finalize_save(s, *save);
}

}  // namespace fp8tron
