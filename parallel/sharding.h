// How each parameter relates to the model's global (single-process) tensor. Parameters are
// initialised from their global tensor, drawn from a generator seeded by (seed, parameter name),
// and then sliced to this rank's shard: every layout starts from exactly the same model, which
// is what makes layouts comparable and checkpoints reshardable.
#pragma once
#include <torch/torch.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/config/parallel_config.h"
#include "parallel/communicator.h"

namespace fp8tron {

struct ParamInfo {
  std::vector<int64_t> global_shape;
  int partition_dim = -1;  // -1: replicated over tensor-parallel ranks
  int interleave = 1;      // >1: the partitioned dim stacks this many blocks, each split (SwiGLU fc1)
  bool reduce_grad_over_tp = false;    // each TP rank holds a partial gradient (SP norms/biases, QK norms)
  bool tied_embedding = false;         // the word embedding, also used by the output layer
  bool shared_embedding_copy = false;  // the last pipeline stage's copy of the tied word embedding
  // A routed expert's weight or bias (mixture of experts): partitioned over the expert
  // tensor-parallel group instead of the tensor-parallel one, its gradient reduced over the
  // expert data-parallel group, and it lives on one expert-parallel rank only.
  bool expert = false;
};

// The tensor-parallel context a module is built in.
struct TensorParallelContext {
  std::shared_ptr<Communicator> comm;
  int rank = 0;
  int size = 1;
  bool sequence_parallel = false;
  // The run's plan for overlapping this group's communication with the linear layers' GEMMs
  // (--tp-comm-overlap, --use-ascend-mc2, --use-ascend-coc); null or disabled: plain collectives.
  std::shared_ptr<const TpOverlapConfig> overlap;
};

// Draws global tensors and keeps this rank's shard.
class ParamFactory {
 public:
  ParamFactory(uint64_t seed, TensorParallelContext tp) : seed_(seed), tp_(std::move(tp)) {}
  // normal(0, std) of the global shape, seeded by `init_name` (usually the parameter's own name).
  torch::Tensor normal(const std::string& init_name, const ParamInfo& info, double std) const;
  torch::Tensor constant(const ParamInfo& info, double value) const;
  torch::Tensor shard(const torch::Tensor& global, const ParamInfo& info) const;
  const TensorParallelContext& tp() const { return tp_; }

 private:
  uint64_t seed_;
  TensorParallelContext tp_;
};

// A module that records ParamInfo for the parameters it registers.
class ShardedModule : public torch::nn::Module {
 public:
  using torch::nn::Module::Module;
  const std::map<std::string, ParamInfo>& param_infos() const { return infos_; }

 // Registers a parameter with its sharding description.
  torch::Tensor add_param(const std::string& name, torch::Tensor value, ParamInfo info) {
    infos_[name] = std::move(info);
    return register_parameter(name, std::move(value));
  }

 private:
  std::map<std::string, ParamInfo> infos_;
};

// Reassembles the global tensor of a parameter from the tensor-parallel shards (all ranks of the
// group call this; every rank gets the whole tensor).
torch::Tensor gather_global_param(const torch::Tensor& shard, const ParamInfo& info, Communicator& tp);

// ParamInfo of every parameter of `root` by full name (walks the module tree).
std::map<std::string, ParamInfo> collect_param_infos(const torch::nn::Module& root);

}  // namespace fp8tron
