// Megatron-Core's token dispatchers (MoE/token_dispatcher.py): they bring each token to the ranks
// holding its experts and bring the expert outputs back.
//   allgather  every rank of the expert tensor x expert parallel group gathers all of the group's
//              tokens, keeps those routed to its local experts, and the combine reduce-scatters
//              the (probability-weighted) outputs back. The default.
//   alltoall   permute by expert, an uneven all-to-all over the expert-parallel group, an uneven
//              all-gather over the expert tensor-parallel group, regroup by local expert; the
//              combine runs the inverse steps and unpermutes with the routing probabilities.
// Either way the experts get rows grouped by local expert with host token counts, after exactly
// one device-to-host copy per layer (the counts). Layouts give the experts the same multiset of
// rows, so losses agree across EP/ETP layouts and dispatchers up to summation order.
// --moe-dispatch-fp8 (alltoall, FP8 experts of a per-block recipe; an fp8tron flag): each token is
// quantized once, before the permutation, as the experts' fc1 quantizes its input (codes and
// per-block scales packed in one byte row, fp8/packed_rows.h); the rows are permuted, exchanged,
// gathered over expert TP and regrouped as bytes, and handed to the experts beside their values,
// which fc1 feeds to its GEMMs as they are. The combine and every backward exchange (gradients)
// stay in the activations' dtype. The forward is bitwise the bf16 dispatch's.
#pragma once
#include <torch/torch.h>

#include "models/moe/routing.h"

#include <memory>
#include <vector>

#include "core/config/moe_config.h"
#include "fp8/fp8_engine.h"
#include "models/moe/moe_context.h"
#include "models/moe/permute.h"

namespace fp8tron {

struct DispatchedTokens {
  torch::Tensor tokens;                     // [rows, H] grouped by local expert
  std::vector<int64_t> tokens_per_expert;   // host, one per local expert
  // --moe-dispatch-fp8: the same rows as they travelled, FP8 codes and scales (uint8 [rows,
  // row_bytes], fp8/packed_rows.h); `tokens` are their values. Undefined otherwise.
  torch::Tensor packed;
};

struct DispatcherOptions {
  int64_t num_experts = 0;
  int64_t num_local_experts = 0;  // num_experts / EP; this rank's are [ep_rank * L, (ep_rank + 1) * L)
  int64_t pad_multiple = 0;       // --moe-router-padding-for-quantization: 16 or 32 (0: off)
  ExpertParallelGroups groups;
  const MoeContext* context = nullptr;  // timers and the dispatch byte counter (may be null)
  // --moe-dispatch-fp8: the engine whose recipe (blockwise or MXFP8) the tokens are quantized with
  // before the alltoall dispatch, the experts' own; null: tokens travel in their dtype.
  std::shared_ptr<fp8::Fp8Engine> fp8_dispatch;
};

class TokenDispatcher {
 public:
  explicit TokenDispatcher(DispatcherOptions options) : options_(std::move(options)) {}
  virtual ~TokenDispatcher() = default;
  // x [T, H]; routing: probs and map [T, E], and the map's column sums when the router already has
  // them. Keeps what combine() needs.
  virtual DispatchedTokens dispatch(const torch::Tensor& x, const moe::Routing& routing) = 0;
  // The experts' outputs [rows, H] (partial sums when expert TP > 1) -> [T, H] in x's dtype, each
  // token the probability-weighted sum of its experts' outputs.
  virtual torch::Tensor combine(const torch::Tensor& y) = 0;

 protected:
  void time(const char* name, bool start) const {
    if (options_.context) options_.context->time(name, start);
  }
  DispatcherOptions options_;
  torch::Dtype input_dtype_ = torch::kFloat32;
};

std::unique_ptr<TokenDispatcher> make_token_dispatcher(MoeDispatcher kind, DispatcherOptions options);

// Host copy of a small integer tensor (the dispatcher's one synchronisation point).
std::vector<int64_t> to_host(const torch::Tensor& counts);

}  // namespace fp8tron
