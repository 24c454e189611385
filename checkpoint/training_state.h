// Training checkpoints: Megatron's --save / --load (save.h, async_saver.h, load.h) on top of the
// torch-free core in this folder (safetensors shards, iter_NNNNNNN layout with atomic commit,
// metadata JSON, resharding). This header: what a checkpoint holds and the state it is taken from.
//
// Tensors, named by the model's global parameter names (the same in every parallel layout):
//   <param>                                  model weights, in the parameter dtype
//   optimizer.state.fp32_param.<param>       fp32 main weights (bf16/fp16 runs; in fp32 runs the
//                                            weights are the main weights)
//   optimizer.state.exp_avg.<param>          Adam's moments (SGD: optimizer.state.momentum_buffer.;
//   optimizer.state.exp_avg_sq.<param>       Muon: momentum_buffer. for its matrices, Adam's two for
//                                            the rest)
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
#include <string>
#include <utility>
#include <vector>
#include <memory>
#pragma once
#include <torch/torch.h>

#include <cstdint>
#include <optional>

#include <nlohmann/json.hpp>

#include "core/config/config.h"
#include "parallel/parallel_state.h"
#include "rerun/rerun_record.h"

namespace fp8tron {

class MixedPrecisionOptimizer;
namespace fp8 {
class Fp8Engine;
}
class LrSchedule;
class LossScaler;

// The rerun engine's record (rerun/rerun_record.h) on its way into and out of a checkpoint.
struct RerunCheckpointIo {
  std::optional<rerun::RerunRecord> to_save;  // saved with the checkpoint when set
  std::optional<rerun::RerunRecord> loaded;   // set by a load from a checkpoint that carries one
  bool loaded_same_layout = false;            // ... saved in this run's parallel layout
};

// What a save in Megatron's torch_dist format records besides the training state; the trainer
// knows it (only trainer/ knows flags).
struct MegatronSaveInfo {
  nlohmann::json arguments;      // the run's arguments under Megatron's names, typed (vars(args))
  double flops_per_sample = 0;   // training FLOPs of one sample (num_floating_point_operations_so_far)
};

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
  // Persistent model buffers by global name (the MoE routers' expert_bias), the same on every
  // tensor- and data-parallel rank of a pipeline stage: checkpointed as fp32 tensors.
  std::vector<std::pair<std::string, torch::Tensor>> buffers;
  int64_t* skipped_train_samples = nullptr;  // --iterations-to-skip's count (null: not tracked)
  RerunCheckpointIo* rerun = nullptr;
  const MegatronSaveInfo* megatron = nullptr;  // set when saves are in Megatron's torch_dist format
};

}  // namespace fp8tron
