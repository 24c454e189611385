// The CUDA kernel of the fused softmax top-k routing (models/moe/fused_topk_routing.h): raw
// pointers, sizes and a stream, no torch.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

namespace fp8tron::moe::kernels {

// The most experts a token chooses in the fused kernel.
constexpr int64_t kMaxFusedTopk = 32;

struct TopkSoftmaxArgs {
  const void* logits = nullptr;  // [tokens, experts], fp32 or bf16 (logits_bf16)
  bool logits_bf16 = false;
  int64_t tokens = 0, experts = 0, topk = 1;
  bool pre_softmax = false;     // select on the softmax over all experts and keep its values
  float scaling_factor = 1.0f;  // multiplies the probs
  void* probs = nullptr;        // [tokens, experts] in the logits' dtype: the selected experts' weights, 0 elsewhere
  bool* map = nullptr;          // [tokens, experts]: the selected experts
  int64_t* counts = nullptr;    // [experts], zeroed by the caller: tokens per expert
  float* scores = nullptr;      // [tokens, experts] fp32: softmax over all experts
  bool* aux_map = nullptr;      // [tokens, experts] or null: the top-k of scores (the aux losses' selection)
  float* aux_counts = nullptr;  // [experts], zeroed by the caller, or null: aux_map's column sums
};

// One warp per token: the softmax over all experts (max, then the sum of exp(l - max), in fp32 with
// accurate expf), the top-k by repeated warp arg-max (ties to the lower expert index, NaN above
// everything, as torch.topk), the probs (post-softmax: the softmax over the k selected logits;
// pre-softmax: the selected scores), the map and the integer counts.
void topk_softmax_routing(const TopkSoftmaxArgs& args, cudaStream_t stream);

}  // namespace fp8tron::moe::kernels
