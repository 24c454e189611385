// Softmax top-k routing in one CUDA kernel (models/moe/router_kernels.h) for the router's common
// case: the probs and map of topk_routing (routing.h), the aux losses' scores and map of
// aux_loss_scores (aux_loss.h), and the column sums both need, from one launch. An autograd
// function: the probs and the scores are differentiable in the logits (the backward is the
// softmax backward of each, written with torch operations).
#pragma once
#include <torch/torch.h>

#include "models/moe/aux_loss.h"
#include "models/moe/routing.h"

namespace fp8tron::moe {

struct FusedRouting {
  Routing routing;  // probs, map, and counts (tokens per expert, int64)
  AuxScores aux;    // scores, map, and counts (fp32)
};

// Whether the kernel takes this case: CUDA logits in fp32 or bf16, softmax scores without
// group-limited selection, top-k at most 32.
bool fused_routing_applies(const torch::Tensor& logits, const TopKOptions& options);

FusedRouting fused_topk_softmax(const torch::Tensor& logits, const TopKOptions& options);

}  // namespace fp8tron::moe
