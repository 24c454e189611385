// --save with --ckpt-format torch_dist: the checkpoint in Megatron-LM's torch_dist format, which
// Megatron's pretrain_gpt.py resumes and fp8tron loads like any of Megatron's
// (megatron/megatron_checkpoint.h):
//
//   <save>/latest_checkpointed_iteration.txt
//   <save>/iter_NNNNNNN/metadata.json       {"sharded_backend": "torch_dist", "sharded_backend_version": 1}
//                       .metadata           PyTorch's distributed-checkpoint Metadata (megatron/dcp_writer.h)
//                       __<rank>_0.distcp   each rank's chunks and objects, torch.save bytes each
//                       common.pt           the common state again (rank 0), where Megatron-Core up to 0.18 reads it
//
// Tensors by Megatron's names and global shapes: the decoder layers' weights stacked along a first
// dimension of --num-layers ("decoder.layers.self_attention.linear_qkv.weight" [L, 3h, h]), each
// rank writing its layers' tensor-parallel boxes once (data-parallel rank 0; a weight replicated
// over tensor-parallel ranks by tensor-parallel rank 0), Adam's moments as
// optimizer.state.exp_avg(_sq).<name>, and with bf16/fp16 weights the fp32 main weights as
// optimizer.state.fp32_param.<name>. Objects: the common state (megatron_common_state.h) and a
// None _extra_state per linear layer (and per core attention with Transformer Engine), as Megatron's
// modules store without FP8. Not written: Megatron's RNG states (the args say no_save_rng) and its
// rerun state machine's (Megatron then starts both afresh), nor fp8tron's rerun record of a faulty
// iteration (a warning says so). fp8tron's own RNG states go into the common state under a key
// Megatron does not read (megatron/megatron_checkpoint.h), so fp8tron resumes them exactly in
// the same layout (unless --no-save-rng).
//
// The files go into iter_NNNNNNN.tmp.<token>/ and the directory is committed (renamed, tracker
// updated) only when every rank wrote its file (checkpoint_dir.h): a failed save leaves nothing.
// As fp8tron's own saves (save.h), `non_persistent` saves go into the non-persistent directory,
// where only the newest is kept, --save-retain-interval applies after a commit, and a save runs
// in three phases which --async-save (async_saver.h) runs apart: prepare (the host copies and the
// objects; every rank together), write (each rank its .distcp file; no collectives, safe on
// another thread), finalize (every rank agrees, rank 0 writes .metadata and commits).
#pragma once
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "checkpoint/checkpoint_dir.h"
#include "checkpoint/megatron/dcp_writer.h"
#include "checkpoint/training_state.h"

namespace fp8tron {

// Every rank, at the same iteration. UserError on every rank when any rank fails.
void save_torch_dist_checkpoint(const TrainingState& s, int64_t iteration, bool non_persistent = false);

// A torch_dist save between its phases.
struct PendingTorchDistSave {
  checkpoint::SaveTarget target;
  std::vector<checkpoint::megatron::DcpObjectToWrite> objects;  // until written
  std::vector<checkpoint::megatron::DcpChunkToWrite> chunks;    // host tensors, until written
  std::string common_pt;  // rank 0: common.pt's bytes, until written
  std::string entries;  // this rank's metadata entries, once written
  std::string error;
  bool non_persistent = false;
  bool for_rerun = false;  // the state before a faulty iteration, saved for its re-run
  std::chrono::steady_clock::time_point start;
  int64_t bytes_copied = 0;  // the chunks' host copies
  double copy_seconds = 0;
};

// `own_copies`: the chunks never alias a training buffer (CPU buffers are copied too), as an
// asynchronous save needs.
std::unique_ptr<PendingTorchDistSave> prepare_torch_dist_save(const TrainingState& s, int64_t iteration,
                                                              bool non_persistent, bool own_copies);
void write_torch_dist_file(PendingTorchDistSave& save, int rank) noexcept;
void finalize_torch_dist_save(const TrainingState& s, PendingTorchDistSave& save);

}  // namespace fp8tron
