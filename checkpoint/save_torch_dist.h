// --save with --ckpt-format torch_dist: the checkpoint in Megatron-LM's torch_dist format, which
// Megatron's pretrain_gpt.py resumes and fp8tron loads like any of Megatron's
// (megatron/megatron_checkpoint.h):
//
//   <save>/latest_checkpointed_iteration.txt
//   <save>/iter_NNNNNNN/metadata.json       {"sharded_backend": "torch_dist", "sharded_backend_version": 1}
//                       .metadata           PyTorch's distributed-checkpoint Metadata (megatron/dcp_writer.h)
//                       __<rank>_0.distcp   each rank's chunks and objects, torch.save bytes each
//
// Tensors by Megatron's names and global shapes: the decoder layers' weights stacked along a first
// dimension of --num-layers ("decoder.layers.self_attention.linear_qkv.weight" [L, 3h, h]), each
// rank writing its layers' tensor-parallel boxes once (data-parallel rank 0; a weight replicated
// over tensor-parallel ranks by tensor-parallel rank 0), Adam's moments as
// optimizer.state.exp_avg(_sq).<name>, and with bf16/fp16 weights the fp32 main weights as
// optimizer.state.fp32_param.<name>. Objects: the common state (megatron_common_state.h) and a
// None _extra_state per linear layer (and per core attention with Transformer Engine), as Megatron's
// modules store without FP8. Not written: the RNG states (the args say no_save_rng) and the rerun
// state machine's (Megatron then starts both afresh), nor fp8tron's rerun record of a faulty
// iteration (a warning says so).
//
// The files go into iter_NNNNNNN.tmp.<token>/ and the directory is committed (renamed, tracker
// updated) only when every rank wrote its file (checkpoint_dir.h): a failed save leaves nothing.
#pragma once
#include <cstdint>

#include "checkpoint/training_state.h"

namespace fp8tron {

// Every rank, at the same iteration. UserError on every rank when any rank fails.
void save_torch_dist_checkpoint(const TrainingState& s, int64_t iteration);

}  // namespace fp8tron
