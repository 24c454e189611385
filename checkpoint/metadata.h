// The checkpoint's metadata file (JSON, one per checkpoint, written by the committing rank):
// everything besides tensor bytes needed to resume exactly — iteration, consumed samples,
// data-loader position, parallel layout, arguments, LR scheduler, loss scaler, RNG states,
// FP8 recipe state — and the tensor table, which says for each global tensor its shape, dtype
// and where every shard of it lives (file, key, box), so any layout can load it.
//
// Binary state (RNG states, FP8 float arrays) is base64 in the JSON so it round-trips bit for
// bit (FP8 arrays as little-endian float32: inf and NaN survive, which JSON numbers cannot).
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/file_io.h"
#include "checkpoint/resharding.h"
#include "checkpoint/safetensors.h"
#include "rerun/rerun_record.h"

namespace fp8tron::checkpoint {

inline constexpr const char* kMetadataFileName = "fp8tron_checkpoint.json";
inline constexpr const char* kMetadataFormat = "fp8tron-checkpoint";
inline constexpr int kMetadataFormatVersion = 1;

struct ParallelLayout {
  int tp = 1, pp = 1, dp = 1, cp = 1, ep = 1, vpp = 1;
  int world_size = 1;
  int etp = 1;  // expert tensor parallelism (absent in checkpoints of dense models: 1)
  bool operator==(const ParallelLayout&) const = default;
};

struct LossScalerState {
  double scale = 1.0;
  int64_t growth_tracker = 0;
  int64_t hysteresis_tracker = 0;
  bool operator==(const LossScalerState&) const = default;
};

// One generator's state on one rank, as opaque bytes (e.g. name "cpu", "cuda", "cuda:tp-rng").
struct RngState {
  int rank = 0;
  std::string name;
  std::string state;  // raw bytes
  bool operator==(const RngState&) const = default;
};

// One stored piece of a global tensor: the box [offset, offset + shape) of the global index
// space, stored row-major in `file` under `key`, starting at element `element_offset` of that
// stored tensor (non-zero when one stored flat range holds several boxes, see
// flat_range_to_boxes). `replicas`: how many ranks held this same box when saving; only one
// copy is stored and listed.
struct ShardEntry {
  std::string file;
  std::string key;
  std::vector<int64_t> offset;
  std::vector<int64_t> shape;
  int64_t element_offset = 0;
  int replicas = 1;
  // XXH3-64 (checksum.h) of the whole stored tensor `key` in `file`, as written; checkpoints of
  // fp8tron versions before checksums have none.
  std::optional<uint64_t> checksum;
  Box box() const { return Box{offset, shape}; }
  bool operator==(const ShardEntry&) const = default;
};

struct TensorEntry {
  DType dtype = DType::F32;
  std::vector<int64_t> shape;  // global
  std::vector<ShardEntry> shards;
  bool operator==(const TensorEntry&) const = default;
};

using TensorTable = std::map<std::string, TensorEntry>;

// Megatron's OptimizerParamScheduler state (the keys of its state_dict besides num_steps): what a
// resumed run checks its own schedule against (--override-opt-param-scheduler,
// --use-checkpoint-opt_param-scheduler). Steps count samples, as in Megatron.
struct SchedulerState {
  double max_lr = 0, min_lr = 0;
  int64_t lr_warmup_steps = 0, lr_decay_steps = 0;
  std::string lr_decay_style;  // Megatron's names: constant, linear, cosine, inverse-square-root, WSD
  double start_wd = 0, end_wd = 0;
  int64_t wd_incr_steps = 0;
  std::string wd_incr_style;   // constant, linear, cosine
  bool operator==(const SchedulerState&) const = default;
};

struct CheckpointMetadata {
  int format_version = kMetadataFormatVersion;
  std::string fp8tron_version, fp8tron_commit;  // what wrote it ("" in older checkpoints)
  int64_t iteration = 0;
  bool release = false;
  int64_t consumed_train_samples = 0;
  int64_t consumed_valid_samples = 0;
  int64_t skipped_train_samples = 0;  // of --iterations-to-skip (absent in older checkpoints: 0)
  double floating_point_operations_so_far = 0;
  std::map<std::string, int64_t> data_loader;  // position, keys chosen by data/
  ParallelLayout parallel;
  std::map<std::string, std::string> args;
  int64_t lr_scheduler_num_steps = 0;
  std::optional<SchedulerState> lr_scheduler;  // absent in checkpoints of older fp8tron versions
  LossScalerState loss_scaler;
  std::vector<RngState> rng;
  std::map<std::string, std::vector<float>> fp8;  // recipe state arrays by name
  // The rerun engine's request to re-run the next iteration on other hardware (--rerun-mode
  // validate_results found a rejected result reproducible); absent in every other checkpoint.
  std::optional<rerun::RerunRecord> rerun;
  TensorTable tensors;
  bool operator==(const CheckpointMetadata&) const = default;
};

// JSON text (validated first). Throws UserError on invalid contents.
std::string serialize_metadata(const CheckpointMetadata& metadata);
// Parses and validates; `source` (a file name) starts every error message.
CheckpointMetadata parse_metadata(const std::string& text, const std::string& source);
// Checks what the types cannot: sizes >= 1, world size = tp*pp*dp*cp, finite loss scale,
// unique RNG entries, each tensor's shards inside it, disjoint and covering it.
void validate_metadata(const CheckpointMetadata& metadata, const std::string& source);

// <dir>/fp8tron_checkpoint.json, atomically (temp + fsync + rename + fsync dir).
void write_metadata(const std::string& dir, const CheckpointMetadata& metadata,
                    const FaultInjection& fault = {});
CheckpointMetadata read_metadata(const std::string& dir);

// ---- building the tensor table across ranks ----

// Records a shard of `name`. Returns false when the same box is already listed: a replica,
// whose copy the caller should not store; the listed entry's `replicas` grows by the new
// entry's. Two ways to build a table: (a) register every holder of every box with
// replicas = 1 in a fixed rank order and store only where add_shard returned true, or
// (b) each rank lists only what it stores (replica id 0, e.g. DP rank 0) with replicas =
// the number of holders, and the tables are merged. A different dtype or global shape for
// the same name is a UserError.
bool add_shard(TensorTable& table, const std::string& name, DType dtype,
               const std::vector<int64_t>& global_shape, const ShardEntry& shard);
// Merges a table from another rank with add_shard (identical boxes count as replicas, the
// first entry's file is kept).
void merge_tensor_tables(TensorTable& into, const TensorTable& from);
// For gathering per-rank tables as strings (over MPI or a TCP store).
std::string serialize_tensor_table(const TensorTable& table);
TensorTable parse_tensor_table(const std::string& text, const std::string& source);

// Base64 (RFC 4648, padded); decode returns false on malformed input.
std::string base64_encode(const std::string& bytes);
bool base64_decode(const std::string& text, std::string& bytes);

}  // namespace fp8tron::checkpoint
