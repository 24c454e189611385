// The scaling state of FP8 attention (--fp8-dot-product-attention, models/attention/
// fp8_attention.h), one site per layer's core attention, owned by the model's FP8 engine.
//
// What is scaled how (the same for every --fp8-recipe of the linears):
//   Q, K, V, dO   current scaling: the amax of the tensor itself (nothing to remember)
//   S             the softmax output lies in [0, 1] and causal rows start with a probability of
//                 exactly 1, so its scale is the format's max (E4M3: 448), as its amax would give
//   O             each output row is a convex combination of rows of V, so |O| <= amax(V): O takes
//                 V's scale halved (room for the FP8 probabilities summing slightly above 1)
//   dP, dQ, dK, dV   written by the fused backward kernel, so their amax is only known afterwards:
//                 delayed scaling, scale = fp8_max / amax / 2^margin from the largest amax of the
//                 previous step (Megatron's default: history length 1, most recent), reduced over
//                 the amax group like the linears' amaxes. Until a step (or a checkpoint) has
//                 given them, a backward pass calibrates: its scales come from its own amaxes
//                 (the cuDNN path runs the kernel twice), so the first step casts as well as the
//                 next ones instead of with scale 1, which leaves E5M2's small gradients one or
//                 two bits.
// Buffers [sites][4] on the model's device: `amax` (what the scales come from; saved in
// checkpoints as the core attention's _extra_state) and `amax_now` (max-accumulated by every
// backward pass of the step, folded into `amax` by end_step()).
#pragma once
#include <torch/torch.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace fp8tron::fp8 {

enum AttentionAmax : int64_t { kAmaxDQ = 0, kAmaxDK = 1, kAmaxDV = 2, kAmaxDP = 3, kAttentionAmaxes = 4 };

struct Fp8AttentionSite {
  std::string name;  // the core attention's global name, e.g. "decoder.layers.3.self_attention.core_attention"
  int64_t index = 0;
};

class AttentionScaling {
 public:
  explicit AttentionScaling(torch::Device device) : device_(device) {}
  std::shared_ptr<Fp8AttentionSite> add_site(const std::string& name);
  const std::vector<std::shared_ptr<Fp8AttentionSite>>& sites() const { return sites_; }

  // The site's row [4] of each buffer (views: the backward pass reads and max-accumulates them).
  torch::Tensor amax(const Fp8AttentionSite& site);
  torch::Tensor amax_now(const Fp8AttentionSite& site);
  // Whether `amax` holds a step's (or a checkpoint's) amaxes; host-side, so no device sync.
  bool calibrated(const Fp8AttentionSite& site) const { return calibrated_[size_t(site.index)] != 0; }
  // A backward pass of the site ran this step (its amaxes are in amax_now).
  void note_backward(const Fp8AttentionSite& site) { seen_[size_t(site.index)] = 1; }

  // After the optimizer step: reduce `amax_now` over the amax group (null: one process), take it
  // where a value was seen, and start the next step's accumulation.
  void end_step(const std::function<void(torch::Tensor&)>& reduce);

  // Checkpoints: the site's `amax` as a CPU fp32 [4]; load checks the size (UserError).
  torch::Tensor site_state(const Fp8AttentionSite& site);
  void load_site_state(const Fp8AttentionSite& site, const torch::Tensor& state);

  // The rerun engine's copy of what a step changes.
  struct Saved {
    torch::Tensor buffers;  // amax and amax_now, stacked
    std::vector<char> calibrated, seen;
  };
  Saved capture();
  void restore(const Saved& saved);

 private:
  struct Buffers {
    torch::Tensor amax, amax_now;  // [sites][4]
  };
  Buffers& buffers();

  torch::Device device_;
  std::vector<std::shared_ptr<Fp8AttentionSite>> sites_;
  std::vector<char> calibrated_, seen_;
  Buffers buffers_;
};

}  // namespace fp8tron::fp8
