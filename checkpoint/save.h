// Saving a checkpoint (Megatron's --save): every rank calls save_checkpoint() at the same
// iteration; it returns when the checkpoint is committed (or throws UserError on every rank,
// leaving the previous checkpoint and tracker untouched). After the commit rank 0 applies
// --save-retain-interval (the previous latest checkpoint is deleted unless its iteration is a
// multiple of it, as Megatron does). `non_persistent`: into the non-persistent directory
// (--non-persistent-global-ckpt-dir, else <save>/non_persistent), where only the newest is kept.
//
// A save runs in three phases, which --async-save (async_saver.h) runs apart: prepare (host
// copies, tensor tables, metadata; every rank together), write (each rank its shard file; no
// collectives, no torch, safe on another thread), finalize (every rank agrees, rank 0 adds every
// rank's tensor checksums to the metadata, writes it and commits).
//
// A state holding NaN or inf (weights, fp32 main weights, optimizer moments) is never saved: the
// save fails on every rank with a line naming the first such parameter, and the previous
// checkpoint stays the latest.
#pragma once
#include <torch/torch.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/checkpoint_dir.h"
#include "checkpoint/metadata.h"
#include "checkpoint/snapshot_buffers.h"
#include "checkpoint/training_state.h"

namespace fp8tron {

void save_checkpoint(const TrainingState& state, int64_t iteration, bool non_persistent = false);

// Both formats' saves end alike:
//  - fail_save_together: every rank learns whether any rank failed; all throw (the failing ones
//    with their message) and the temporary directory is removed, so the previous checkpoint stays
//    the latest;
//  - retire_after_commit (rank 0, once a save is committed): only then is anything deleted, and
//    only checkpoints older than the one just committed (a run resumed from an older one keeps the
//    newer ones). --save-retain-interval (Megatron's rule): the previous latest checkpoint goes
//    unless its iteration is a multiple of the interval. Non-persistent checkpoints: every older
//    one in their directory goes. A checkpoint saved for a faulty iteration's re-run (`for_rerun`)
//    retires nothing: the one saved before the fault is the way back.
void fail_save_together(const ParallelState& p, const torch::Device& device, const checkpoint::SaveTarget& target,
                        const std::string& error);
void retire_after_commit(const CheckpointConfig& k, const checkpoint::SaveTarget& target, bool non_persistent,
                         bool for_rerun, std::optional<checkpoint::Tracker> previous);

// A flat buffer a save reads and the elements [begin, end) of it this rank writes: the model
// weights (one buffer, replicated over data-parallel ranks), and with the optimizer state the
// fp32 main weights (bf16/fp16 runs) and the optimizer's states, laid out from shard_begin().
struct SaveSource {
  std::string prefix;  // tensor-name prefix ("" for the model weights)
  torch::Tensor buffer;
  int64_t begin = 0, end = 0;
  size_t domain = 0;   // the optimizer domain whose buffer it is (dense, experts)
};

// What this rank saves, in a fixed order (the snapshot buffers are matched by position): per
// optimizer domain, the model weights first, then the optimizer's buffers.
std::vector<SaveSource> save_sources(const TrainingState& s);

// The device a buffer's host copy is pinned for; -1 for CPU buffers.
int pin_device(const torch::Tensor& t);

struct RankShards;

// A save between its phases: prepared (host copies, tables, metadata) by every rank together,
// written by each rank alone (possibly on another thread), finalized (committed) together.
struct PendingSave {
  checkpoint::SaveTarget target;
  std::unique_ptr<RankShards> shards;
  std::optional<checkpoint::CheckpointMetadata> metadata;  // rank 0
  std::string error;
  std::string checksums;  // this rank's stored tensors as "key\tchecksum" lines, once written
  uint64_t bytes = 0;
  std::chrono::steady_clock::time_point start;
  int64_t bytes_copied = 0;  // into the snapshot buffers (asynchronous saves)
  double copy_seconds = 0;   // taking the host copies
  bool non_persistent = false;
  bool for_rerun = false;  // the state before a faulty iteration, saved for its re-run elsewhere
  PendingSave();
  ~PendingSave();  // where RankShards is complete
};

// Synchronous saves pass no snapshot (CPU buffers are read in place, GPU ones copied to pageable
// memory); asynchronous ones copy into the reusable snapshot buffers.
std::unique_ptr<PendingSave> prepare_save(const TrainingState& s, int64_t iteration, bool non_persistent,
                                          SnapshotBuffers* snapshot);
void write_shards(PendingSave& save) noexcept;
void finalize_save(const TrainingState& s, PendingSave& save);

}  // namespace fp8tron
