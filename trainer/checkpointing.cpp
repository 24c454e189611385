#include "trainer/checkpointing.h"

#include <ATen/Context.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>

#include "core/error.h"
#include "core/log.h"
#include "core/text.h"
#include "fp8/fp8_linear.h"
#include "trainer/checkpoint/checkpoint_dir.h"
#include "trainer/checkpoint/metadata.h"
#include "trainer/checkpoint/sharded_io.h"
#include "trainer/host_buffer.h"
#include "trainer/loss_scaler.h"
#include "trainer/lr_schedule.h"
#include "trainer/mixed_precision_optimizer.h"

namespace fp8tron {
namespace ck = checkpoint;
namespace {

using Clock = std::chrono::steady_clock;
using Slot = MixedPrecisionOptimizer::ParamSlot;

constexpr const char* kMainParamPrefix = "optimizer.state.fp32_param.";
constexpr const char* kStepName = "optimizer.state.step";
constexpr const char* kEmbeddingName = "embedding.word_embeddings.weight";
constexpr const char* kFp8StateSuffix = "._extra_state";

ck::DType checkpoint_dtype(torch::ScalarType t) {
  switch (t) {
    case torch::kFloat32: return ck::DType::F32;
    case torch::kBFloat16: return ck::DType::BF16;
    case torch::kFloat16: return ck::DType::F16;
    case torch::kFloat64: return ck::DType::F64;
    default: break;
  }
  FP8TRON_CHECK(false, std::string("no checkpoint dtype for ") + c10::toString(t));
}

torch::ScalarType torch_dtype(ck::DType d, const std::string& tensor) {
  switch (d) {
    case ck::DType::F32: return torch::kFloat32;
    case ck::DType::BF16: return torch::kBFloat16;
    case ck::DType::F16: return torch::kFloat16;
    case ck::DType::F64: return torch::kFloat64;
    default: break;
  }
  throw UserError(strprintf("checkpoint tensor '%s' is %s; model weights and optimizer states must be F32, BF16, F16 "
                            "or F64", tensor.c_str(), ck::dtype_name(d)));
}

// The optimizer's per-parameter states besides the main weights: Adam's moments or SGD's
// momentum, as (tensor-name prefix, flat buffer laid out from shard_begin()).
std::vector<std::pair<std::string, torch::Tensor>> optimizer_states(const MixedPrecisionOptimizer& o,
                                                                    const OptimizerConfig& c) {
  if (c.optimizer == "adam")
    return {{"optimizer.state.exp_avg.", o.exp_avg()}, {"optimizer.state.exp_avg_sq.", o.exp_avg_sq()}};
  return {{"optimizer.state.momentum_buffer.", o.exp_avg()}};
}

// The name a parameter has in checkpoints: its own, except the last stage's tied-embedding copy.
std::string checkpoint_name(const Slot& slot) { return slot.info.shared_embedding_copy ? kEmbeddingName : slot.name; }

// A rank's shard of a parameter as boxes of the global tensor: the local elements
// [begin, begin + numel) (row-major in the local shape) are `box` row-major. One box, or with an
// interleaved partition (SwiGLU fc1: [2 x ffn, h] split per block) one per block.
struct Piece {
  ck::Box box;
  int64_t begin = 0, numel = 0;
};

std::vector<Piece> param_pieces(const Slot& slot, int tp_rank, int tp_size) {
  const auto& info = slot.info;
  const std::vector<int64_t>& g = info.global_shape;
  if (info.partition_dim < 0 || tp_size == 1) {
    FP8TRON_CHECK(slot.shape == g, slot.name + ": a replicated parameter's shape differs from its global shape");
    return {Piece{ck::whole(g), 0, slot.numel}};
  }
  const size_t d = size_t(info.partition_dim);
  const int64_t k = info.interleave;
  FP8TRON_CHECK(k == 1 || d == 0, slot.name + ": interleaved partitions are supported along dim 0 only");
  const int64_t block = g[d] / k, piece = block / tp_size;
  std::vector<Piece> pieces;
  for (int64_t j = 0; j < k; ++j) {
    Piece p;
    p.box = ck::whole(g);
    p.box.offset[d] = j * block + tp_rank * piece;
    p.box.shape[d] = piece;
    p.numel = ck::box_volume(p.box);
    p.begin = j * p.numel;
    pieces.push_back(std::move(p));
  }
  std::vector<int64_t> local = g;
  local[d] = k * piece;
  FP8TRON_CHECK(local == slot.shape && k * pieces.front().numel == slot.numel,
                slot.name + ": the local shard does not match its global shape and partition");
  return pieces;
}

const char* bytes_at(const torch::Tensor& t, int64_t element) {
  return static_cast<const char*>(t.data_ptr()) + element * int64_t(t.element_size());
}

// ---- collectives over all ranks ----------------------------------------------------------------

bool any_rank(const ParallelState& p, const torch::Device& device, bool flag) {
  if (p.sizes.world_size == 1) return flag;
  auto t = torch::full({1}, flag ? 1.0f : 0.0f, torch::TensorOptions().device(device));
  p.world->all_reduce(t, ReduceOp::Max);
  return t.item<float>() > 0;
}

void barrier(const ParallelState& p) {
  if (p.sizes.world_size > 1) p.world->barrier();
}

std::vector<std::string> all_gather_strings(const ParallelState& p, const torch::Device& device, const std::string& mine) {
  const int n = p.sizes.world_size;
  if (n == 1) return {mine};
  const auto on_device = torch::TensorOptions().device(device);
  auto length = torch::full({1}, int64_t(mine.size()), on_device.dtype(torch::kInt64));
  auto lengths = torch::empty({n}, length.options());
  p.world->all_gather(lengths, length);
  lengths = lengths.cpu();
  const int64_t longest = std::max<int64_t>(1, lengths.max().item<int64_t>());
  auto buffer = torch::zeros({longest}, torch::kUInt8);
  if (!mine.empty()) std::memcpy(buffer.data_ptr(), mine.data(), mine.size());
  buffer = buffer.to(device);
  auto all = torch::empty({n * longest}, buffer.options());
  p.world->all_gather(all, buffer);
  all = all.cpu();
  std::vector<std::string> out;
  for (int r = 0; r < n; ++r)
    out.emplace_back(reinterpret_cast<const char*>(all.data_ptr()) + r * longest, size_t(lengths[r].item<int64_t>()));
  return out;
}

// Length-prefixed fields in one string (for one all-gather).
std::string pack(const std::vector<std::string>& fields) {
  std::string out;
  for (const auto& f : fields) {
    const uint64_t n = f.size();
    out.append(reinterpret_cast<const char*>(&n), sizeof n);
    out += f;
  }
  return out;
}

std::vector<std::string> unpack(const std::string& packed) {
  std::vector<std::string> out;
  size_t at = 0;
  while (at < packed.size()) {
    uint64_t n = 0;
    FP8TRON_CHECK(at + sizeof n <= packed.size(), "truncated field");
    std::memcpy(&n, packed.data() + at, sizeof n);
    at += sizeof n;
    FP8TRON_CHECK(at + n <= packed.size(), "truncated field");
    out.push_back(packed.substr(at, n));
    at += n;
  }
  return out;
}

// ---- RNG ---------------------------------------------------------------------------------------

std::string generator_state(const torch::Device& device) {
  at::Generator g = at::globalContext().defaultGenerator(device);
  std::lock_guard<std::mutex> lock(g.mutex());
  torch::Tensor state = g.get_state().contiguous();
  return std::string(static_cast<const char*>(state.data_ptr()), size_t(state.numel() * state.element_size()));
}

void set_generator_state(const torch::Device& device, const std::string& bytes, const std::string& source) {
  at::Generator g = at::globalContext().defaultGenerator(device);
  auto state = torch::empty({int64_t(bytes.size())}, torch::kUInt8);
  if (!bytes.empty()) std::memcpy(state.data_ptr(), bytes.data(), bytes.size());
  try {
    std::lock_guard<std::mutex> lock(g.mutex());
    g.set_state(state);
  } catch (const c10::Error& e) {
    throw UserError(strprintf("%s: the %s RNG state cannot be restored (%s)", source.c_str(), device.str().c_str(),
                              e.what_without_backtrace()));
  }
}

// ---- what identifies the model -----------------------------------------------------------------

struct ModelField {
  std::string key, value, flags;
};

std::vector<ModelField> model_fields(const ModelConfig& m) {
  auto b = [](bool v) { return std::string(v ? "true" : "false"); };
  auto i = [](int64_t v) { return std::to_string(v); };
  const bool learned = m.position_embedding == PositionEmbedding::LearnedAbsolute;
  return {
      {"num_layers", i(m.num_layers), "--num-layers"},
      {"hidden_size", i(m.hidden_size), "--hidden-size"},
      {"ffn_hidden_size", i(m.ffn_hidden_size), "--ffn-hidden-size"},
      {"num_attention_heads", i(m.num_attention_heads), "--num-attention-heads"},
      {"kv_channels", i(m.kv_channels), "--kv-channels"},
      {"num_query_groups", i(m.num_query_groups), "--num-query-groups"},
      {"vocab_size", i(m.vocab_size), "--vocab-size or the tokenizer"},
      {"padded_vocab_size", i(m.padded_vocab_size),
       "--make-vocab-size-divisible-by x --tensor-model-parallel-size pads the vocabulary"},
      {"position_embedding_type", learned ? "learned_absolute" : "rope", "--position-embedding-type"},
      {"max_position_embeddings", learned ? i(m.max_position_embeddings) : "none", "--max-position-embeddings"},
      {"normalization", m.normalization == Normalization::RMSNorm ? "RMSNorm" : "LayerNorm", "--normalization"},
      {"apply_layernorm_1p", b(m.apply_layernorm_1p), "--apply-layernorm-1p"},
      {"swiglu", b(m.swiglu), "--swiglu"},
      {"add_bias_linear", b(m.add_bias_linear), "--disable-bias-linear"},
      {"add_qkv_bias", b(m.add_qkv_bias), "--add-qkv-bias"},
      {"untie_embeddings_and_output_weights", b(m.untie_embeddings_and_output_weights),
       "--untie-embeddings-and-output-weights"},
      {"qk_layernorm", b(m.qk_layernorm), "--qk-layernorm"},
  };
}

void check_model(const ck::CheckpointMetadata& m, const Config& c, const std::string& path) {
  std::vector<std::string> differences;
  for (const auto& f : model_fields(c.model)) {
    auto it = m.args.find("model." + f.key);
    if (it == m.args.end() || it->second == f.value) continue;
    differences.push_back(strprintf("%s is %s in the checkpoint but %s here (%s)", f.key.c_str(), it->second.c_str(),
                                    f.value.c_str(), f.flags.c_str()));
  }
  if (!differences.empty())
    throw UserError("checkpoint " + path + " was saved from a different model: " + join(differences, "; "));
}

ck::ParallelLayout layout_of(const TrainingState& s) {
  const ParallelSizes& z = s.parallel.sizes;
  ck::ParallelLayout l;
  l.tp = z.tp;
  l.pp = z.pp;
  l.dp = z.dp;
  l.cp = z.cp;
  l.ep = z.ep;
  l.vpp = s.config.distributed.virtual_stages;
  l.world_size = z.world_size;
  return l;
}

// Where non-persistent checkpoints of `base` (--save or --load) live.
std::string non_persistent_dir(const CheckpointConfig& k, const std::string& base) {
  return k.non_persistent_dir.empty() ? base + "/non_persistent" : k.non_persistent_dir;
}

std::string layout_string(const ck::ParallelLayout& l) {
  std::string s = strprintf("(TP, PP, DP) = (%d, %d, %d)", l.tp, l.pp, l.dp);
  if (l.vpp > 1) s += strprintf(" with %d virtual stages", l.vpp);
  return s;
}

// ---- saving ------------------------------------------------------------------------------------

// A flat buffer a save reads and the elements [begin, end) of it this rank writes: the model
// weights (one buffer, replicated over data-parallel ranks), and with the optimizer state the
// fp32 main weights (bf16/fp16 runs) and the optimizer's states, laid out from shard_begin().
struct SaveSource {
  std::string prefix;  // tensor-name prefix ("" for the model weights)
  torch::Tensor buffer;
  int64_t begin = 0, end = 0;
};

// The part of a buffer replicated over data-parallel ranks that this rank writes: all of it on
// data-parallel rank 0 only, or with fully parallel saves (Megatron's default) an equal part on
// every data-parallel rank.
std::pair<int64_t, int64_t> replica_part(const TrainingState& s, int64_t numel) {
  const int dp = s.parallel.sizes.dp, r = s.parallel.dp_rank;
  if (!s.config.checkpoint.fully_parallel_save || dp == 1) return {0, r == 0 ? numel : 0};
  const int64_t part = (numel + dp - 1) / dp;
  return {std::min(numel, r * part), std::min(numel, (r + 1) * part)};
}

// What this rank saves, in a fixed order (the snapshot buffers are matched by position):
// the model weights first, then the optimizer's buffers. Distributed-optimizer shards are
// written by the rank holding them, replicas over data-parallel ranks once (replica_part).
std::vector<SaveSource> save_sources(const TrainingState& s) {
  const MixedPrecisionOptimizer& o = s.optimizer;
  const torch::Tensor model = o.model_params();
  const auto [first, last] = replica_part(s, model.numel());
  std::vector<SaveSource> sources = {{"", model, first, last}};
  if (s.config.checkpoint.save_optim) {
    auto add = [&](const std::string& prefix, const torch::Tensor& buffer) {
      const auto [a, b] = o.distributed() ? std::pair<int64_t, int64_t>{0, buffer.numel()} : replica_part(s, buffer.numel());
      sources.push_back({prefix, buffer, a, b});
    };
    if (model.scalar_type() != torch::kFloat32) add(kMainParamPrefix, o.main_params());
    for (const auto& [prefix, buffer] : optimizer_states(o, s.config.optimizer)) add(prefix, buffer);
  }
  return sources;
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

// This rank's shard file: the writer points into host copies of the buffers kept here.
struct RankShards {
  explicit RankShards(int rank) : writer(ck::rank_file_name(rank)) {}
  ck::RankShardWriter writer;
  std::vector<torch::Tensor> host_buffers;
  float step = 0;
};

}  // namespace

// The reusable host memory of asynchronous saves, one buffer per save source (by position),
// pinned for GPU buffers. reserve() fills it on a background thread; saves reuse what matches.
struct SnapshotBuffers {
  std::vector<torch::Tensor> buffers;
  std::thread reserving;                 // until joined: the background allocation
  std::vector<torch::Tensor> reserved;   // its result
  std::string reserve_error;             // its failure, reported at the first save
  std::atomic<double> reserve_seconds{0};
  AsyncSaveStats* stats = nullptr;

  ~SnapshotBuffers() {
    if (reserving.joinable()) reserving.join();
  }
  // Joins the background allocation (if any) and takes its buffers; returns the seconds waited,
  // or -1 when there was nothing to join.
  double take_reserved() {
    if (!reserving.joinable()) return -1;
    const auto start = std::chrono::steady_clock::now();
    reserving.join();
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    stats->reserve_seconds = reserve_seconds;
    if (!reserve_error.empty()) {
      log::warning("the host memory for asynchronous checkpoint saves could not be reserved at start-up (" +
                   reserve_error + "); trying again now");
    } else {
      buffers = std::move(reserved);
    }
    return waited;
  }
  // The buffer for source `index`: reused when it has the size and dtype wanted.
  torch::Tensor get(size_t index, int64_t numel, torch::ScalarType dtype, int pin_for_device) {
    if (index >= buffers.size()) buffers.resize(index + 1);
    torch::Tensor& b = buffers[index];
    if (!b.defined() || b.numel() != numel || b.scalar_type() != dtype) {
      b = torch::Tensor();  // release the old one first
      b = allocate_host_tensor(numel, dtype, pin_for_device);
      if (numel > 0) ++stats->buffers_allocated_by_saves;
    }
    return b;
  }
};

namespace {

int pin_device(const torch::Tensor& t) { return t.is_cuda() ? int(t.device().index()) : -1; }

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

std::unique_ptr<RankShards> collect_shards(const TrainingState& s, SnapshotBuffers* snapshot, int64_t* bytes_copied) {
  s.optimizer.finish_param_gather();  // --overlap-param-gather: the model weights must be complete
  const MixedPrecisionOptimizer& o = s.optimizer;
  const ParallelState& p = s.parallel;
  const int tp = p.sizes.tp, dp = p.sizes.dp;
  auto out = std::make_unique<RankShards>(p.world_rank);
  const std::vector<SaveSource> sources = save_sources(s);
  const std::vector<HostRange> host = host_ranges(sources, snapshot, out->host_buffers, bytes_copied);
  const int64_t shard_begin = o.distributed() ? o.shard_begin() : 0;  // where the optimizer's buffers start
  for (const Slot& slot : o.param_slots()) {
    if (slot.info.shared_embedding_copy) continue;            // stored by the first stage
    if (slot.info.partition_dim < 0 && p.tp_rank != 0) continue;  // replicated over TP: rank 0 stores it
    const auto& g = slot.info.global_shape;
    const auto pieces = param_pieces(slot, p.tp_rank, tp);
    const int replicas = dp * (slot.info.partition_dim < 0 ? tp : 1);
    for (size_t i = 0; i < sources.size(); ++i) {
      const SaveSource& src = sources[i];
      const std::string name = src.prefix + slot.name;
      const ck::DType dtype = checkpoint_dtype(src.buffer.scalar_type());
      const bool replicated = i == 0 || !o.distributed();  // over data-parallel ranks
      const int64_t base = i == 0 ? 0 : shard_begin;        // flat-buffer index of the source's element 0
      const int64_t lo = base + src.begin, hi = base + src.end;  // what this rank writes, in flat-buffer indices
      for (const auto& piece : pieces) {
        const int64_t first = slot.offset + piece.begin;
        const int64_t a = std::max(lo, first), b = std::min(hi, first + piece.numel);
        if (a >= b) continue;
        if (replicated && a == first && b == first + piece.numel)
          out->writer.add(name, dtype, g, piece.box, host[i].at(a - base, b - a), replicas);
        else  // a distributed-optimizer shard, or this rank's part of a replica cut by the split
          out->writer.add_flat_range(name, dtype, g, piece.box, a - first, b - first, host[i].at(a - base, b - a));
      }
    }
  }
  // FP8 recipe state: the same on every tensor- and data-parallel rank of a stage (amaxes are
  // reduced over them), so the first of them stores it.
  if (s.fp8 && p.tp_rank == 0 && p.dp_rank == 0) {
    for (const auto& site : s.fp8->sites()) {
      const torch::Tensor state = s.fp8->site_state(*site);
      if (!state.defined()) continue;
      const torch::Tensor buffer = state;  // a fresh host tensor: kept alive with the shard's buffers
      out->host_buffers.push_back(buffer);
      out->writer.add(site->name + kFp8StateSuffix, ck::DType::F32, {buffer.numel()}, ck::whole({buffer.numel()}),
                      buffer.data_ptr(), tp * dp);
    }
  }
  if (s.config.checkpoint.save_optim && p.world_rank == 0) {
    out->step = float(o.step_count());
    out->writer.add(kStepName, ck::DType::F32, {1}, ck::whole({1}), &out->step);
  }
  return out;
}

// Rank 0's metadata for the checkpoint, from every rank's packed (tensor table, RNG states).
ck::CheckpointMetadata build_metadata(const TrainingState& s, int64_t iteration, const std::vector<std::string>& packed) {
  ck::CheckpointMetadata m;
  m.iteration = iteration;
  m.consumed_train_samples = s.consumed_train_samples;
  m.consumed_valid_samples = s.consumed_valid_samples;
  // The data loaders are positioned by the samples consumed (Megatron's sampler).
  m.data_loader = {{"train_consumed_samples", s.consumed_train_samples},
                   {"valid_consumed_samples", s.consumed_valid_samples}};
  m.parallel = layout_of(s);
  for (const auto& [name, value] : s.config.resolved_flags) m.args[name] = value;
  for (const auto& f : model_fields(s.config.model)) m.args["model." + f.key] = f.value;
  m.lr_scheduler_num_steps = s.schedule.num_steps();
  m.loss_scaler = ck::LossScalerState{s.scaler.scale(), s.scaler.growth_tracker(), s.scaler.hysteresis_tracker()};
  for (size_t rank = 0; rank < packed.size(); ++rank) {
    const auto fields = unpack(packed[rank]);
    FP8TRON_CHECK(!fields.empty() && fields.size() % 2 == 1, "malformed shard description");
    ck::merge_tensor_tables(m.tensors, ck::parse_tensor_table(fields[0], ck::rank_file_name(int(rank))));
    for (size_t i = 1; i + 1 < fields.size(); i += 2) m.rng.push_back(ck::RngState{int(rank), fields[i], fields[i + 1]});
  }
  return m;
}

// Every rank learns whether any rank failed; all throw (the failing ones with their message) and
// the temporary directory is removed, so the previous checkpoint stays the latest.
void fail_together(const ParallelState& p, const torch::Device& device, const ck::SaveTarget& target,
                   const std::string& error) {
  if (!any_rank(p, device, !error.empty())) return;
  if (p.world_rank == 0) ck::abort_save(target);
  throw UserError(!error.empty() ? error
                                 : strprintf("saving the checkpoint of iteration %lld to %s failed on another rank "
                                             "(its error is in its log)",
                                             (long long)target.iteration, target.save_dir.c_str()));
}

// The same token on every rank: rank 0's clock.
std::string agree_on_token(const ParallelState& p, const torch::Device& device) {
  const int64_t now = std::chrono::duration_cast<std::chrono::microseconds>(
                          std::chrono::system_clock::now().time_since_epoch()).count();
  auto t = torch::full({1}, now ^ (int64_t(getpid()) << 40), torch::TensorOptions().dtype(torch::kInt64).device(device));
  if (p.sizes.world_size > 1) p.world->broadcast(t, 0);
  return std::to_string(std::abs(t.cpu().item<int64_t>()));
}

}  // namespace

// A save between its phases: prepared (host copies, tables, metadata) by every rank together,
// written by each rank alone (possibly on another thread), finalized (committed) together.
struct PendingSave {
  ck::SaveTarget target;
  std::unique_ptr<RankShards> shards;
  std::optional<ck::CheckpointMetadata> metadata;  // rank 0
  std::string error;
  uint64_t bytes = 0;
  Clock::time_point start;
  int64_t bytes_copied = 0;  // into the snapshot buffers (asynchronous saves)
  double copy_seconds = 0;   // taking the host copies
  bool non_persistent = false;
};

namespace {

std::unique_ptr<PendingSave> prepare_save(const TrainingState& s, int64_t iteration, bool non_persistent,
                                          SnapshotBuffers* snapshot) {
  const CheckpointConfig& k = s.config.checkpoint;
  const ParallelState& p = s.parallel;
  auto save = std::make_unique<PendingSave>();
  save->start = Clock::now();
  save->non_persistent = non_persistent;
  const std::string dir = non_persistent ? non_persistent_dir(k, k.save) : k.save;
  log::info(strprintf("saving %scheckpoint at iteration %7lld to %s in fp8tron format", non_persistent ? "non-persistent " : "",
                      (long long)iteration, dir.c_str()));
  save->target = ck::SaveTarget{dir, iteration, false, agree_on_token(p, s.device)};
  const auto copy_start = Clock::now();
  save->shards = collect_shards(s, snapshot, &save->bytes_copied);
  save->copy_seconds = std::chrono::duration<double>(Clock::now() - copy_start).count();
  // Rank 0 gathers every rank's tensor table and RNG states for the metadata.
  std::vector<std::string> fields = {ck::serialize_tensor_table(save->shards->writer.table())};
  if (k.save_rng) {
    fields.insert(fields.end(), {"cpu", generator_state(torch::Device(torch::kCPU))});
    if (s.device.is_cuda()) fields.insert(fields.end(), {"cuda", generator_state(s.device)});
  }
  const std::vector<std::string> packed = all_gather_strings(p, s.device, pack(fields));
  try {
    if (p.world_rank == 0) save->metadata = build_metadata(s, iteration, packed);
    ck::begin_save(save->target);
  } catch (const UserError& e) {
    save->error = e.what();
  }
  return save;
}

// Every rank's shard file (and rank 0's metadata) into the temporary directory. No collectives,
// no torch: safe on a background thread.
void write_shards(PendingSave& save) noexcept {
  if (!save.error.empty()) return;
  try {
    const std::string dir = ck::temp_dir_path(save.target);
    save.bytes = save.shards->writer.write(dir).bytes;
    if (save.metadata) ck::write_metadata(dir, *save.metadata);
  } catch (const std::exception& e) {
    save.error = e.what();
  }
}

// Removes the committed checkpoint of `iteration` in `dir` (best effort: a failure is logged; a
// symbolic link is left alone, as Megatron does).
void delete_checkpoint(const std::string& dir, int64_t iteration) {
  const std::string path = dir + "/" + ck::checkpoint_dir_name(iteration);
  struct stat st {};
  if (lstat(path.c_str(), &st) != 0) return;
  if (S_ISLNK(st.st_mode)) {
    log::info(strprintf("  skipping deleting checkpoint from iteration %7lld at %s since it is a symbolic link",
                        (long long)iteration, dir.c_str()));
    return;
  }
  if (ck::remove_tree(path))
    log::info(strprintf("  successfully deleted checkpoint from iteration %7lld at %s", (long long)iteration, dir.c_str()));
  else
    log::warning(strprintf("could not delete all of the checkpoint of iteration %lld at %s", (long long)iteration,
                           dir.c_str()));
}

// Rank 0, once a save is committed. --save-retain-interval (Megatron's rule): the previous
// latest checkpoint goes unless its iteration is a multiple of the interval. Non-persistent
// checkpoints: every other one in their directory goes (the new one is complete by now).
void clean_up_after_commit(const CheckpointConfig& k, const PendingSave& save, std::optional<ck::Tracker> previous) {
  const ck::SaveTarget& t = save.target;
  if (save.non_persistent) {
    for (int64_t it : ck::list_checkpoint_iterations(t.save_dir))
      if (it != t.iteration) delete_checkpoint(t.save_dir, it);
    return;
  }
  if (k.save_retain_interval && previous && !previous->release && previous->iteration > 0 &&
      previous->iteration != t.iteration && previous->iteration % *k.save_retain_interval != 0)
    delete_checkpoint(t.save_dir, previous->iteration);
}

// Every rank: agree that all files are there, rank 0 commits, all learn the outcome.
void finalize_save(const TrainingState& s, PendingSave& save) {
  const ParallelState& p = s.parallel;
  save.shards.reset();
  fail_together(p, s.device, save.target, save.error);
  std::optional<ck::Tracker> previous;
  if (p.world_rank == 0) {
    try {
      previous = ck::read_tracker(save.target.save_dir);
    } catch (const UserError&) {
      // a garbage tracker is replaced by the commit; nothing to retain or delete
    }
    try {
      ck::CommitOptions commit;
      for (int r = 0; r < p.sizes.world_size; ++r) commit.expected_files.push_back(ck::rank_file_name(r));
      commit.expected_files.push_back(ck::kMetadataFileName);
      commit.expected_file_count = int64_t(commit.expected_files.size());
      ck::commit_save(save.target, commit);
    } catch (const UserError& e) {
      save.error = e.what();
    }
  }
  fail_together(p, s.device, save.target, save.error);
  const double seconds = std::chrono::duration<double>(Clock::now() - save.start).count();
  log::info(strprintf("  successfully saved checkpoint from iteration %7lld to %s [ t %d/%d, p %d/%d ]",
                      (long long)save.target.iteration, save.target.save_dir.c_str(), p.tp_rank + 1, p.sizes.tp,
                      p.pp_rank + 1, p.sizes.pp));
  log::info(strprintf("  checkpoint save took %.2f s (rank 0 wrote %.1f MB, %.2f GB/s)", seconds, double(save.bytes) / 1e6,
                      double(save.bytes) / 1e9 / std::max(seconds, 1e-9)));
  if (p.world_rank == 0) clean_up_after_commit(s.config.checkpoint, save, previous);
}

// ---- loading -----------------------------------------------------------------------------------

// The elements [begin, end) of this rank's shard of a parameter (row-major in its local shape),
// read from checkpoint tensor `name` in the dtype it was saved in.
torch::Tensor read_local_range(ck::CheckpointReader& reader, const std::string& name, const Slot& slot,
                               const std::vector<Piece>& pieces, int64_t begin, int64_t end) {
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
      reader.read(name, dtype, slot.info.global_shape, box, dst + at * element_size);
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

void load_parameters(ck::CheckpointReader& reader, const TrainingState& s, bool load_optim) {
  MixedPrecisionOptimizer& o = s.optimizer;
  const ParallelState& p = s.parallel;
  const CheckpointConfig& k = s.config.checkpoint;
  const std::string& path = reader.location().path;
  torch::NoGradGuard no_grad;
  // Main weights come from the fp32 copy when the optimizer state is loaded (exact resume) or
  // --load-main-params-from-ckpt asks; otherwise from the model weights, as Megatron does.
  const bool fp32_main = load_optim || k.load_main_params_from_ckpt;
  const auto states = optimizer_states(o, s.config.optimizer);
  const torch::Tensor main = o.main_params();
  const int64_t shard_begin = o.shard_begin(), shard_end = o.shard_begin() + o.shard_numel();
  // Each read: checkpoint tensor -> this rank's range of a flat buffer. `requested` also holds
  // the model weights superseded by their fp32 copies (they are part of the model's state).
  struct Read {
    std::string name;
    const Slot* slot;
    torch::Tensor destination;
    int64_t begin, end;
  };
  std::vector<Read> reads;
  std::set<std::string> requested;
  for (const Slot& slot : o.param_slots()) {
    const int64_t lo = std::max(slot.offset, shard_begin), hi = std::min(slot.offset + slot.numel, shard_end);
    if (lo >= hi) continue;
    const std::string name = checkpoint_name(slot);
    const std::string source = fp32_main && reader.has_tensor(kMainParamPrefix + name) ? kMainParamPrefix + name : name;
    requested.insert(name);
    reads.push_back({source, &slot, main.narrow(0, lo - shard_begin, hi - lo), lo - slot.offset, hi - slot.offset});
    if (!load_optim) continue;
    for (const auto& [prefix, buffer] : states)
      reads.push_back({prefix + name, &slot, buffer.narrow(0, lo - shard_begin, hi - lo), lo - slot.offset, hi - slot.offset});
  }
  if (load_optim) requested.insert(kStepName);
  for (const Read& r : reads) requested.insert(r.name);

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

  for (const Read& r : reads) {
    if (strict.skip_unexpected && unexpected.count(r.name)) continue;
    const auto pieces = param_pieces(*r.slot, p.tp_rank, p.sizes.tp);
    r.destination.copy_(read_local_range(reader, r.name, *r.slot, pieces, r.begin, r.end).to(torch::kFloat32));
  }
  if (load_optim && !(strict.skip_unexpected && unexpected.count(kStepName))) {
    float step = 0;
    reader.read(kStepName, ck::DType::F32, {1}, ck::whole({1}), &step);
    o.set_step_count(step);
  }
  // Model weights = main weights in the parameter dtype (data-parallel all-gather with the
  // distributed optimizer), exactly what the step after the save published.
  o.publish_model_params();
  if (s.fp8) s.fp8->invalidate_weights();
}

// The FP8 scales and amax histories, so a resumed run quantizes with the scales it would have
// used. A checkpoint without them (bf16 run, or another recipe) starts the recipe afresh.
void load_fp8_state(ck::CheckpointReader& reader, const TrainingState& s) {
  if (!s.fp8) return;
  int64_t restored = 0, missing = 0;
  for (const auto& site : s.fp8->sites()) {
    const std::string name = site->name + kFp8StateSuffix;
    if (!reader.has_tensor(name)) {
      ++missing;
      continue;
    }
    const auto& shape = reader.metadata().tensors.at(name).shape;
    auto state = torch::empty(shape, torch::kFloat32);
    reader.read(name, ck::DType::F32, shape, ck::whole(shape), state.data_ptr());
    s.fp8->load_site_state(*site, state);
    ++restored;
  }
  if (restored > 0 && missing > 0)
    throw UserError(strprintf("checkpoint holds the FP8 recipe state of %lld linear layers but not of %lld others; "
                              "was it saved with another --first-last-layers-bf16 / --fp8-min-features?",
                              (long long)restored, (long long)missing));
  if (restored == 0 && recipe_kind(s.fp8->recipe()) == fp8::RecipeKind::kDelayed)
    log::info(" > the checkpoint holds no FP8 delayed-scaling state: scales start from 1, as in a new run");
}

void restore_rng(const ck::CheckpointMetadata& m, const TrainingState& s, const std::string& path) {
  if (m.rng.empty())
    throw UserError("checkpoint " + path + " holds no RNG state (saved with --no-save-rng); pass --no-load-rng to "
                    "continue with the RNG seeded from --seed");
  const ck::ParallelLayout here = layout_of(s);
  if (!(m.parallel == here)) {
    log::info(" > RNG states not restored: the checkpoint's layout " + layout_string(m.parallel) + " differs from " +
              layout_string(here) + "; random streams (dropout) continue from --seed");
    return;
  }
  bool cuda_restored = false;
  for (const auto& r : m.rng) {
    if (r.rank != s.parallel.world_rank) continue;
    if (r.name == "cpu") set_generator_state(torch::Device(torch::kCPU), r.state, path);
    if (r.name == "cuda" && s.device.is_cuda()) {
      set_generator_state(s.device, r.state, path);
      cuda_restored = true;
    }
  }
  if (s.device.is_cuda() && !cuda_restored)
    log::info(" > the checkpoint holds no CUDA RNG state (saved on the CPU?); the CUDA generator continues from --seed");
}

}  // namespace

void save_checkpoint(const TrainingState& s, int64_t iteration, bool non_persistent) {
  std::unique_ptr<PendingSave> save = prepare_save(s, iteration, non_persistent, nullptr);
  write_shards(*save);
  finalize_save(s, *save);
}

AsyncCheckpointSaver::AsyncCheckpointSaver() : snapshot_(std::make_unique<SnapshotBuffers>()) {
  snapshot_->stats = &stats_;
}

AsyncCheckpointSaver::~AsyncCheckpointSaver() {
  // An unfinished save is left uncommitted; the next successful commit there removes it.
  if (writer_.joinable()) writer_.join();
  if (snapshot_->reserving.joinable()) snapshot_->reserving.join();  // it writes stats_
}

void AsyncCheckpointSaver::reserve(const TrainingState& s) {
  if (snapshot_->reserving.joinable() || !snapshot_->buffers.empty()) return;
  // Only sizes and dtypes are read here; the thread allocates, faults in and pins the memory.
  // It runs beside start-up and the first iterations rather than before them: the first save
  // usually comes many iterations later, and start-up is not delayed by the allocation (several
  // seconds for a model in the billions of parameters). A save that comes sooner waits for it.
  struct Wanted {
    int64_t numel;
    torch::ScalarType dtype;
    int device;
  };
  std::vector<Wanted> wanted;
  for (const SaveSource& src : save_sources(s))
    wanted.push_back({src.end - src.begin, src.buffer.scalar_type(), pin_device(src.buffer)});
  SnapshotBuffers* snapshot = snapshot_.get();
  AsyncSaveStats* stats = &stats_;
  const bool pinned = s.device.is_cuda();
  snapshot->reserving = std::thread([snapshot, stats, wanted, pinned] {
    const auto start = Clock::now();
    try {
      for (const Wanted& w : wanted) {
        snapshot->reserved.push_back(allocate_host_tensor(w.numel, w.dtype, w.device));
        if (w.numel > 0) {
          ++stats->buffers_reserved;
          stats->bytes_reserved += w.numel * int64_t(c10::elementSize(w.dtype));
        }
      }
    } catch (const std::exception& e) {
      snapshot->reserved.clear();
      snapshot->reserve_error = e.what();
    }
    snapshot->reserve_seconds = std::chrono::duration<double>(Clock::now() - start).count();
    if (snapshot->reserve_error.empty())
      log::info(strprintf(" > host memory for --async-save reserved in the background: %.2f GB%s in %.2f s",
                          double(stats->bytes_reserved) / 1e9, pinned ? " (pinned)" : "", snapshot->reserve_seconds.load()));
  });
}

void AsyncCheckpointSaver::save(const TrainingState& s, int64_t iteration, bool non_persistent) {
  const auto start = Clock::now();
  finalize(s, true);  // one save in flight: its host buffers are this one's
  const double waited_previous = std::chrono::duration<double>(Clock::now() - start).count();
  const double waited_reserve = snapshot_->take_reserved();
  const int64_t allocated_before = stats_.buffers_allocated_by_saves;
  pending_ = prepare_save(s, iteration, non_persistent, snapshot_.get());
  done_ = false;
  writer_ = std::thread([this] {
    write_shards(*pending_);
    done_ = true;
  });
  stats_.saves += 1;
  stats_.last_blocked_seconds = std::chrono::duration<double>(Clock::now() - start).count();
  stats_.last_copy_seconds = pending_->copy_seconds;
  stats_.last_copied_bytes = pending_->bytes_copied;
  const int64_t allocated = stats_.buffers_allocated_by_saves - allocated_before;
  std::string detail = strprintf("copying %.2f GB to %s: %.2f s", double(pending_->bytes_copied) / 1e9,
                                 s.device.is_cuda() ? "pinned host memory" : "host memory", pending_->copy_seconds);
  if (allocated > 0) detail += strprintf(", %lld buffers allocated by this save", (long long)allocated);
  if (waited_reserve >= 0)  // the first save after reserve()
    detail += strprintf("; host memory reserved in the background at start-up: %.2f GB in %.2f s, waited %.2f s for it",
                        double(stats_.bytes_reserved) / 1e9, stats_.reserve_seconds, waited_reserve);
  if (waited_previous >= 0.005) detail += strprintf("; waiting for the previous save: %.2f s", waited_previous);
  log::info(strprintf("  training blocked %.2f s (%s); the checkpoint is written in the background",
                      stats_.last_blocked_seconds, detail.c_str()));
}

void AsyncCheckpointSaver::finalize(const TrainingState& s, bool blocking) {
  if (!pending_) return;  // saves happen at the same iterations on every rank: all agree
  if (!blocking) {
    // Commit only once every rank's writer is done; until then training goes on.
    bool all_done = done_;
    if (s.parallel.sizes.world_size > 1) all_done = !any_rank(s.parallel, s.device, !done_);
    if (!all_done) return;
  }
  writer_.join();
  std::unique_ptr<PendingSave> save = std::move(pending_);
  finalize_save(s, *save);
}

namespace {

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
    const std::string dir = non_persistent_dir(k, k.load);
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

}  // namespace

int64_t load_checkpoint(const TrainingState& s) {
  const CheckpointConfig& k = s.config.checkpoint;
  if (k.load.empty()) return 0;
  const ParallelState& p = s.parallel;
  const std::optional<ToLoad> found = checkpoint_to_load(k);
  if (!found) return 0;
  const ck::CheckpointLocation& location = found->location;
  const std::string& from = found->dir;
  log::info(strprintf("loading checkpoint from %s at iteration %lld", from.c_str(), (long long)location.iteration));
  if (!std::filesystem::exists(location.path + "/" + ck::kMetadataFileName)) {
    const std::string format = ck::foreign_checkpoint_format(location.path);
    if (!format.empty())
      throw UserError("checkpoint " + location.path + " is in the " + format +
                      " format; fp8tron reads only its own format (per-rank safetensors shards + " +
                      ck::kMetadataFileName + "), which any fp8tron run writes with --save");
  }
  ck::CheckpointReader reader(location);
  const ck::CheckpointMetadata& m = reader.metadata();
  check_model(m, s.config, location.path);
  const ck::ParallelLayout here = layout_of(s);
  if (!(m.parallel == here))
    log::info(" > resharding: the checkpoint was saved with " + layout_string(m.parallel) + ", this run uses " +
              layout_string(here));

  const bool restart = k.finetune || location.release;  // weights only, counters from zero
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
    s.schedule.set_num_steps(m.lr_scheduler_num_steps);
    s.scaler.restore(m.loss_scaler.scale, m.loss_scaler.growth_tracker, int(m.loss_scaler.hysteresis_tracker));
  }
  if (!restart) {
    s.consumed_train_samples = m.consumed_train_samples;
    s.consumed_valid_samples = m.consumed_valid_samples;
    if (k.load_rng) restore_rng(m, s, location.path);
  }
  reader.close_files();
  barrier(p);
  const int64_t iteration = restart ? 0 : m.iteration;
  log::info(strprintf("  successfully loaded checkpoint from %s [ t %d/%d, p %d/%d ] at iteration %lld", from.c_str(),
                      p.tp_rank + 1, p.sizes.tp, p.pp_rank + 1, p.sizes.pp, (long long)iteration));
  return iteration;
}

}  // namespace fp8tron
