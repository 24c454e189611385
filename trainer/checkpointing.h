// Training checkpoints: Megatron's --save / --load on top of the torch-free core in
// trainer/checkpoint/ (safetensors shards, iter_NNNNNNN layout with atomic commit, metadata JSON,
// resharding).
//
// Tensors, named by the model's global parameter names (the same in every parallel layout):
//   <param>                                  model weights, in the parameter dtype
//   optimizer.state.fp32_param.<param>       fp32 main weights (bf16/fp16 runs; in fp32 runs the
//                                            weights are the main weights)
//   optimizer.state.exp_avg.<param>          Adam's moments (SGD: optimizer.state.momentum_buffer.)
//   optimizer.state.exp_avg_sq.<param>
//   optimizer.state.step                     Adam's step count, shape [1]
//   <linear>._extra_state                    FP8 delayed-scaling state of a linear layer (its
//                                            amax histories, scales, the recipe's step count),
//                                            as TE's extra state: replicated, one copy stored
// Every rank writes rank_NNNNN.safetensors with the boxes of the global tensors it holds:
// tensor-parallel shards as boxes, distributed-optimizer shards as flat ranges, each replica
// (over data-parallel ranks, and over tensor-parallel ranks for replicated parameters) once; a
// buffer replicated over data-parallel ranks is written in equal parts by all of them (Megatron's
// fully parallel save; --no-ckpt-fully-parallel-save: by data-parallel rank 0). The last pipeline
// stage's copy of a tied embedding is not stored; it is loaded from the embedding.
// Rank 0 writes the metadata (iteration, consumed samples, layout, arguments, LR scheduler,
// loss scaler, every rank's CPU/CUDA RNG state, the tensor table) and commits the directory.
//
// The fp32 main weights, optimizer moments and step, scheduler, loss scaler, consumed samples
// and RNG states are the whole training state, so a resume in the same layout continues bit for
// bit; a different layout reads its own boxes out of the saved ones (RNG streams then restart).
#pragma once
#include <torch/torch.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#include "parallel/parallel_state.h"
#include "trainer/config.h"

namespace fp8tron {

class MixedPrecisionOptimizer;
namespace fp8 {
class Fp8Engine;
}
class LrSchedule;
class LossScaler;

// The trainer's state that a checkpoint saves and restores.
struct TrainingState {
  const Config& config;
  const ParallelState& parallel;
  torch::Device device;
  MixedPrecisionOptimizer& optimizer;  // holds the parameters (flat buffers) and their state
  LrSchedule& schedule;
  LossScaler& scaler;
  int64_t& consumed_train_samples;
  int64_t& consumed_valid_samples;
  fp8::Fp8Engine* fp8 = nullptr;  // FP8 recipe state (null: no FP8)
};

// Every rank calls this at the same iteration; returns when the checkpoint is committed (or
// throws UserError on every rank, leaving the previous checkpoint and tracker untouched).
// After the commit rank 0 applies --save-retain-interval (the previous latest checkpoint is
// deleted unless its iteration is a multiple of it, as Megatron does). `non_persistent`: into
// the non-persistent directory (--non-persistent-global-ckpt-dir, else <save>/non_persistent),
// where only the newest is kept.
void save_checkpoint(const TrainingState& state, int64_t iteration, bool non_persistent = false);

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
struct PendingSave;
struct SnapshotBuffers;
struct AsyncSaveStats {
  int64_t buffers_reserved = 0;            // allocated by reserve()
  int64_t bytes_reserved = 0;
  double reserve_seconds = 0;              // the background allocation (known after the first save)
  int64_t buffers_allocated_by_saves = 0;  // allocated inside save() (none when the reservation fit)
  int64_t saves = 0;
  double last_blocked_seconds = 0;         // training blocked in the last save()
  double last_copy_seconds = 0;            // of which copying to host memory
  int64_t last_copied_bytes = 0;
};

class AsyncCheckpointSaver {
 public:
  AsyncCheckpointSaver();
  AsyncCheckpointSaver(const AsyncCheckpointSaver&) = delete;
  AsyncCheckpointSaver& operator=(const AsyncCheckpointSaver&) = delete;
  ~AsyncCheckpointSaver();  // waits for the writer; an unfinalized save stays uncommitted

  void reserve(const TrainingState& state);  // returns at once; see above
  void save(const TrainingState& state, int64_t iteration, bool non_persistent = false);
  void finalize(const TrainingState& state, bool blocking);
  bool pending() const { return pending_ != nullptr; }
  const AsyncSaveStats& stats() const { return stats_; }

 private:
  AsyncSaveStats stats_;
  std::unique_ptr<PendingSave> pending_;
  std::thread writer_;
  std::atomic<bool> done_{false};
  std::unique_ptr<SnapshotBuffers> snapshot_;
};

// Every rank, after the model and optimizer are built: loads --load (the tracker's iteration or
// --ckpt-step) honouring --finetune, --no-load-optim, --no-load-rng and
// --load-main-params-from-ckpt. Returns the iteration to continue from; 0 when nothing was loaded
// or with --finetune.
int64_t load_checkpoint(const TrainingState& state);

}  // namespace fp8tron
