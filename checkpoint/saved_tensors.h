// How the optimizer's flat buffers map onto checkpoint tensors: the tensor names, dtypes, and the
// boxes of each global tensor that a rank's shard of a parameter covers.
#pragma once
#include <torch/torch.h>

#include <string>
#include <utility>
#include <vector>

#include "core/config/training_config.h"
#include "checkpoint/resharding.h"
#include "checkpoint/safetensors.h"
#include "optim/mixed_precision_optimizer.h"

namespace fp8tron {

struct TrainingState;
namespace fp8 {
struct Fp8Site;
}

using Slot = OptimizerDomain::ParamSlot;

constexpr const char* kMainParamPrefix = "optimizer.state.fp32_param.";
// The fp32 main weights as Megatron's distributed optimizer stores them (`fully_reshardable`).
constexpr const char* kDistributedMainParamPrefix = "optimizer.state.param.";
constexpr const char* kStepName = "optimizer.state.step";
constexpr const char* kEmbeddingName = "embedding.word_embeddings.weight";
constexpr const char* kFp8StateSuffix = "._extra_state";
// A linear layer's FP8 recipe state in a torch_dist checkpoint: a tensor of fp8tron's own, this
// prefix before the module's name (Transformer Engine's _extra_state objects hold None there).
constexpr const char* kTorchDistFp8StatePrefix = "fp8tron_fp8_state.";

checkpoint::DType checkpoint_dtype(torch::ScalarType t);
// Throws UserError naming `tensor` when the dtype cannot hold weights or optimizer states.
torch::ScalarType torch_dtype(checkpoint::DType d, const std::string& tensor);

// The optimizer's per-parameter states besides the main weights: Adam's moments, SGD's
// momentum, or with Muon both Adam moments' buffers (Muon's matrices keep their momentum in the
// first), as (tensor-name prefix, flat buffer laid out from shard_begin()): to save (moments
// scaled per parameter come as fp32 copies), or to load into (OptimizerDomain::moments_to_load:
// MixedPrecisionOptimizer::adopt_loaded_states() completes the load).
std::vector<std::pair<std::string, torch::Tensor>> optimizer_states_to_save(const OptimizerDomain& o,
                                                                           const OptimizerConfig& c);
std::vector<std::pair<std::string, torch::Tensor>> optimizer_states_to_load(OptimizerDomain& o, const OptimizerConfig& c);
// Their tensor-name prefixes alone.
std::vector<std::string> optimizer_state_prefixes(const OptimizerConfig& c);

// The checkpoint name of `slot`'s part of the buffer saved under `prefix` (the model weights: "";
// kMainParamPrefix; an optimizer_states() prefix), or "" when the parameter has no such state:
// a Muon matrix's momentum is "optimizer.state.momentum_buffer.<name>" and it has no second moment.
std::string state_name(const std::string& prefix, const Slot& slot, const OptimizerConfig& c);

// The name a parameter has in checkpoints: its own, except the last stage's tied-embedding copy.
std::string checkpoint_name(const Slot& slot);

// A rank's shard of a parameter as boxes of the global tensor: the local elements
// [begin, begin + numel) (row-major in the local shape) are `box` row-major. One box, or with an
// interleaved partition (SwiGLU fc1: [2 x ffn, h] split per block) one per block.
struct Piece {
  checkpoint::Box box;
  int64_t begin = 0, numel = 0;
};
std::vector<Piece> param_pieces(const Slot& slot, int tp_rank, int tp_size);

// Whether this rank stores `site`'s FP8 recipe state: the first rank of the site's amax group
// (tensor x data parallel, context parallel too with `first_cp`; an expert's expert tensor x
// expert data parallel), on every rank of which the state is the same.
bool stores_fp8_state(const TrainingState& s, const fp8::Fp8Site& site, bool first_cp);

// The address of element `element` of a contiguous tensor.
const char* bytes_at(const torch::Tensor& t, int64_t element);

}  // namespace fp8tron
