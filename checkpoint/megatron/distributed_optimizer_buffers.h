// The optimizer state of Megatron's distributed optimizer in a torch_dist checkpoint, in its
// default layout (`distrib_optim_sharding_type: dp_reshardable`): one flat fp32 buffer per
// gradient-buffer bucket for each of `param` (the fp32 main weights), `exp_avg` and `exp_avg_sq`,
//   optimizer.distributed.dp_group_idx_<g>.gbuf_idx_<b>.dtype_(<param>, <grad>).bucket_idx_<k>.<key>
// with the parameters laid out as Megatron's gradient buffer orders them (reverse module order,
// starts padded), and Adam's step in the `optimizer.distributed.dp_group_idx_<g>.optimizer`
// object's parameter groups. Each model-parallel rank (a tensor- and pipeline-parallel rank,
// `<g>`) has buffers of its own, holding its stage's parameters as its tensor-parallel rank holds
// them.
//
// The layout is not stored, and Megatron's module order differs from fp8tron's, so each
// parameter is found by its value: the checkpoint also holds every weight by name, and the
// segment of `param` that equals the weight, or a tensor-parallel rank's part of it (split as
// Megatron splits it, tensor_parallel_split.h, over the saved run's ranks), rounded to the
// weight's dtype in bf16/fp16 runs, is where its moments lie; the parts' moments are joined as the
// weight is. Weights equal to one another (untrained norms in bf16) are told apart by Megatron's
// order (placed_before_in_megatron_buffer).
//
// The buffers hold the whole model's state (for a 70B model, 840 GB in fp32), so nothing is read
// whole: the weights are searched for by a fingerprint (length, first values, a hash of all),
// the `param` buffers streamed chunk by chunk, and a rank searches only for the weights whose
// state it reads (with every one-dimensional weight, which untrained may equal another); each
// weight's state is then a stored tensor that reads its own segments of the buffers when asked.
//
// Megatron's legacy torch format keeps the same buffers in distrib_optim.pt beside each
// model-parallel rank's model_optim_rng.pt (DistributedOptimizer.save_parameter_state: per
// gradient buffer and dtype {"param", "exp_avg", "exp_avg_sq", "numel_unpadded"}, the buckets
// concatenated without the padding at their ends; a list of those for a chained optimizer), and
// Adam's step in model_optim_rng.pt's parameter groups. They are searched alike, read in ranges
// straight from the files (TorchArchive::flat_record): a file holds its rank's whole state.
#pragma once
#include <map>
#include <set>
#include <string>
#include <vector>

#include "checkpoint/megatron/dcp_checkpoint.h"
#include "checkpoint/megatron/megatron_checkpoint.h"

namespace fp8tron::checkpoint::megatron {

// Whether Megatron's gradient buffer places parameter `a` before `b`: it takes the parameters in
// reverse order of registration (the output layer first, then the multi-token-prediction layers,
// the final norm, the decoder layers from the last, the embedding). Tells weights equal to one
// another apart.
bool placed_before_in_megatron_buffer(const std::string& a, const std::string& b);

// Whether `name` is one of the distributed optimizer's flat tensors or objects.
bool is_distributed_optimizer_entry(const std::string& name);

// Adds optimizer.state.exp_avg(_sq).<param> (and optimizer.state.fp32_param.<param> when the
// weights are not fp32) of out.dcp's buffers, read when asked, for every weight in `weights_read`
// (fp8tron's names; null: every weight already in out.tensors), and Adam's step. UserError when a
// weight cannot be found in the buffers, or the buffers are not this layout.
void read_distributed_optimizer_buffers(MegatronCheckpoint& out, const std::set<std::string>* weights_read);

// The same from the distrib_optim.pt files of a legacy checkpoint's model-parallel ranks (the
// step is read from their model_optim_rng.pt files beforehand); out.legacy_optimizer_reads counts
// the bytes read of them.
void read_legacy_distributed_optimizer(const std::vector<std::string>& files, MegatronCheckpoint& out,
                                       const std::set<std::string>* weights_read);

}  // namespace fp8tron::checkpoint::megatron
