#pragma once
#include <atomic>
#include <cstdint>
#include <memory>
#include <thread>

#include "checkpoint/snapshot_buffers.h"
#include "checkpoint/training_state.h"

namespace fp8tron {

struct PendingSave;
struct PendingTorchDistSave;

// --async-save: training waits only while the state is copied to host memory and the tables are
// gathered; a background thread per rank writes the shard files, and the checkpoint is committed
// (tracker updated) once every rank's writer is done: finalize(blocking = false) at each
// iteration boundary checks that with one tiny all-reduce, finalize(blocking = true) waits. One
// save is in flight at a time: save() finalizes the previous one first. Every rank calls save()
// and finalize() at the same points.
//
// The host memory (pinned for GPU state) is reused from save to save. reserve(), called once the
// optimizer exists, allocates it on a background thread, sized for what this rank's saves copy
// (model weights, fp32 main weights, optimizer states), so the first save blocks only for the
// device-to-host copy too; a save whose sizes differ from the reservation allocates what it needs.
//
// With --ckpt-format torch_dist (as Megatron, whose --async-save needs that format) the save is
// Megatron's (save_torch_dist.h), its host copies taken per save rather than into the reserved
// buffers (reserve() is not called for it).
class AsyncCheckpointSaver {
 public:
  AsyncCheckpointSaver();
  AsyncCheckpointSaver(const AsyncCheckpointSaver&) = delete;
  AsyncCheckpointSaver& operator=(const AsyncCheckpointSaver&) = delete;
  ~AsyncCheckpointSaver();  // waits for the writer; an unfinalized save stays uncommitted

  void reserve(const TrainingState& state);  // returns at once; see above
  void save(const TrainingState& state, int64_t iteration, bool non_persistent = false);
  void finalize(const TrainingState& state, bool blocking);
  bool pending() const { return pending_ != nullptr || pending_torch_dist_ != nullptr; }
  const AsyncSaveStats& stats() const { return stats_; }

 private:
  AsyncSaveStats stats_;
  std::unique_ptr<PendingSave> pending_;
  std::unique_ptr<PendingTorchDistSave> pending_torch_dist_;
  std::thread writer_;
  std::atomic<bool> done_{false};
  std::unique_ptr<SnapshotBuffers> snapshot_;
};

}  // namespace fp8tron
