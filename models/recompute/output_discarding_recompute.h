// Megatron's CheckpointWithoutOutput, behind --recompute-modules moe_act, layernorm (norms that are
// modules of their own: an MoE layer's pre-MLP norm, MLA's input norm) and mla_up_proj. The
// function's outputs are handed to their consumer, which saves them for its own backward pass (the
// experts' fc2 its input, attention its q, k, v); once the consumer has run, discard() frees the
// outputs' memory, and just before the backward pass reaches the consumer's output they are
// recomputed into that same memory, so the consumer's saved tensors are whole again, and the
// function's gradient flows through the replay. What stays in memory: the function's inputs.
//
// The replay is the same computation as the first pass (models/recompute/replay_state.h: dropout
// generators, no second FP8 amax record); the first pass keeps no graph (its graph is built on
// detached inputs and dropped, like recompute()'s).
#pragma once
#include <torch/torch.h>

#include <functional>
#include <memory>
#include <vector>

namespace fp8tron {

class OutputDiscardingRecompute {
 public:
  using Fn = std::function<std::vector<torch::Tensor>(const std::vector<torch::Tensor>& inputs)>;

  // fn(inputs), each output a tensor of its own memory. `fn` is called again during backward and
  // must read no state that changes in between besides the RNG. Without grad mode: fn(inputs),
  // and discard() does nothing.
  std::vector<torch::Tensor> run(const Fn& fn, const std::vector<torch::Tensor>& inputs);
  torch::Tensor run_one(const std::function<torch::Tensor(const torch::Tensor&)>& fn, const torch::Tensor& input);

  // After the consumer of run()'s outputs has produced `consumer_output`: frees the outputs'
  // memory; the backward pass recomputes them before it runs consumer_output's gradient node.
  void discard(const torch::Tensor& consumer_output);

  struct Node;

 private:
  std::shared_ptr<Node> node_;
};

}  // namespace fp8tron
