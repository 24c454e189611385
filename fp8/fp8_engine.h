// The FP8 engine of a model chunk: the recipe, one site per FP8 linear (its slots of the
// delayed-scaling state, its cached weight casts), the cuBLASLt handle, the backward kernels of the
// norm and the SwiGLU that its casts fuse, and the cast statistics. One per model, built by its
// owner and handed to the modules, so two models with different recipes live in one process.
//
// Delayed scaling: every FP8 GEMM site owns five slots of the engine's [history_len][slots]
// history (scaling_state.h's layout). Quantizers max-accumulate amaxes into row 0 during the step;
// end_step() reduces row 0 over the amax group (tensor-parallel, by default also data-parallel,
// as Megatron's amax reduction group) in one all-reduce and updates every scale on the device.
#pragma once
#include <torch/torch.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/deferred_work.h"
#include "fp8/attention_scaling.h"
#include "fp8/norm_backward.h"
#include "fp8/quantize.h"
#include "fp8/recipe.h"
#include "fp8/swiglu_backward.h"

namespace fp8tron::fp8 {

class GemmHandle;

struct Fp8EngineOptions {
  Recipe recipe;
  // GEMMs whose input or output features (per tensor-parallel rank) are below this stay bf16:
  // their casts can cost more than the faster FP8 GEMM saves (docs/fp8.md). 0: all FP8.
  int64_t min_features = 0;
  // --first-last-layers-bf16: global layer numbers [0, bf16_first) and [num_layers - bf16_last,
  // num_layers) stay bf16.
  int64_t bf16_first_layers = 0, bf16_last_layers = 0, num_layers = 0;
  // --deterministic-mode: no atomically accumulated bias gradients.
  bool deterministic = false;
  // Gradient-accumulation fusion (Megatron's, --no-gradient-accumulation-fusion turns it off): on
  // the native path the wgrad GEMMs accumulate into the weights' fp32 main gradients.
  bool gradient_accumulation_fusion = true;
  // Whether the GEMMs' algorithms are timed on first use (fp8/gemm.h's AlgoSelection::kAutotune)
  // or taken from cuBLASLt's heuristic (the same kernels in every run: --deterministic-mode).
  bool autotune_gemms = true;
  // --fp8-transposes: keep (the transposed FP8 copies the backward GEMMs read are cast in the
  // forward pass and kept until backward, the weight's for the whole step: Transformer Engine's
  // way, the fewest casts) or recast (false: cast again in backward from what a bf16 run keeps
  // anyway, so FP8 holds nothing a bf16 run does not; fp8_linear.h says which copies).
  bool keep_transposes = true;
  // Megatron's --no-fp8-wgrad (false; Transformer Engine's override_linear_precision.wgrad): the
  // weight-gradient GEMMs run in bf16 from the unquantized input and output gradient (fp8_linear.h);
  // the forward and dgrad GEMMs stay FP8.
  bool fp8_wgrad = true;
  // --fp8-dot-product-attention: the core attention runs through FP8 kernels too
  // (models/attention/fp8_attention.h), its scales kept by attention() (fp8/attention_scaling.h).
  bool dot_product_attention = false;
  bool attention_emulated = false;  // tests: the emulated FP8 attention on the GPU too
};

// Replaces row 0 of the amax history (a [num_slots] fp32 tensor) by its maximum over the ranks
// that must share scales. Null: no reduction (one process).
using AmaxReducer = std::function<void(torch::Tensor& amaxes)>;

class Fp8Engine;
struct Quantized;

// One FP8 GEMM site: a linear layer of a model chunk, registered by its module.
struct Fp8Site {
  Fp8Engine* engine = nullptr;
  std::string name;  // the module's global name, e.g. "decoder.layers.3.mlp.linear_fc1"
  size_t index = 0;  // GEMM number: its slots in the delayed-scaling state
  int64_t out_features = 0, in_features = 0;
  torch::Tensor parameter;  // the module's weight (set by the module that registered the site)
  // The weight quantized for the current optimizer step, shared by every micro-batch.
  uint64_t weight_generation = ~uint64_t{0};
  const void* weight_data = nullptr;
  int64_t weight_version = -1;
  std::shared_ptr<Quantized> weight;
  // The step (weight generation) whose wgrad the main gradient holds: the first backward of a
  // step overwrites it, later micro-batches accumulate (see Fp8Engine::overwrites_main_grads).
  uint64_t main_grad_generation = ~uint64_t{0};
  // --fp8-param-gather: the weight's FP8 codes [out, in] as the distributed optimizer cast them
  // from the fp32 main weights and gathered them, with their dequantization factor; used instead
  // of quantizing `parameter` while `codes_generation` is the engine's weight generation.
  torch::Tensor codes, codes_scale_inv;
  uint64_t codes_generation = ~uint64_t{0};
  // --delay-wgrad-compute: the queue that holds this linear's wgrad GEMM (fp8/held_wgrad.h); null:
  // the backward pass runs it.
  std::shared_ptr<DeferredWork> wgrad_queue;
};

class Fp8Engine {
 public:
  Fp8Engine(const Fp8EngineOptions& options, torch::Device device);
  ~Fp8Engine();

  const Recipe& recipe() const { return options_.recipe; }
  const Fp8EngineOptions& options() const { return options_; }
  torch::Device device() const { return device_; }
  bool emulated() const { return emulated_; }  // GPU without FP8 tensor cores for this recipe

  // Module construction: registers the GEMM site `name` (the module's global name, e.g.
  // "decoder.layers.3.mlp.linear_fc1") of a linear with local [out, in] features. Returns null
  // when the site runs in bf16 (size threshold, --first-last-layers-bf16).
  std::shared_ptr<Fp8Site> add_site(const std::string& name, int64_t layer, int64_t out_features, int64_t in_features);
  size_t num_sites() const { return sites_.size(); }
  const std::vector<std::shared_ptr<Fp8Site>>& sites() const { return sites_; }

  // After each optimizer step: the weights changed (cached FP8 weights are stale); with delayed
  // scaling, on every --fp8-interval-th step the amaxes are reduced and the scales updated.
  // The FP8 attention's amaxes are reduced by `reduce_attention` (dense layers' group), every step.
  void end_step(const AmaxReducer& reduce, const AmaxReducer& reduce_attention = nullptr);
  // --fp8-dot-product-attention: registers the core attention of global layer `layer`; null when
  // FP8 attention is off or the layer stays bf16 (--first-last-layers-bf16).
  std::shared_ptr<Fp8AttentionSite> add_attention_site(const std::string& name, int64_t layer);
  AttentionScaling& attention() { return attention_; }
  // Whether global layer `layer` stays bf16 (--first-last-layers-bf16); -1: no layer (always FP8).
  bool bf16_layer(int64_t layer) const;
  // Whether the wgrad GEMMs write the fp32 main gradients themselves, overwriting them in the first
  // backward of each step (the native path): the optimizer need not zero those gradients. Call
  // before the first step; requires every site's weight gradient in every step (a GPT's linears).
  bool overwrites_main_grads() const { return !emulated_ && device_.is_cuda(); }
  void set_overwrite_main_grads(bool on) { overwrite_main_grads_ = on && overwrites_main_grads(); }
  bool overwrite_main_grads() const { return overwrite_main_grads_; }
  // The weights were replaced (checkpoint load): drop cached FP8 weights.
  void invalidate_weights() { ++weight_generation_; }

  // What an optimizer step's passes change in the engine (the delayed-scaling amax histories,
  // scales and step count), for running a step again from the same state (the rerun engine).
  // capture_step_state() clones the device buffers without waiting; restore_step_state() copies
  // them back in place, drops the step's cast statistics, and starts a new weight generation, so
  // the cached FP8 weights are cast again (with the restored scales) and the first backward
  // overwrites the main gradients as in a fresh step.
  struct StepState {
    torch::Tensor history, scale, scale_inv;  // undefined for recipes without state
    AttentionScaling::Saved attention;        // empty without FP8 attention
    uint64_t steps = 0;
  };
  StepState capture_step_state();
  void restore_step_state(const StepState& state);
  uint64_t weight_generation() const { return weight_generation_; }
  uint64_t steps() const { return steps_; }

  // Delayed scaling buffers (allocated when the first site runs): history [len][slots], scale and
  // scale_inv [slots]; undefined for other recipes.
  torch::Tensor& history() { ensure_state(); return history_; }
  torch::Tensor& scale() { ensure_state(); return scale_; }
  torch::Tensor& scale_inv() { ensure_state(); return scale_inv_; }
  size_t slot(const Fp8Site& site, TensorRole role) const;

  // Checkpoints: the recipe state of one site as a flat fp32 tensor (CPU): its five slots'
  // histories (history_len x 5, oldest completed step last as in the engine), scales and
  // scale_invs, so a resumed run continues with identical scales in any parallel layout. Empty
  // for recipes without state.
  torch::Tensor site_state(const Fp8Site& site);
  void load_site_state(const Fp8Site& site, const torch::Tensor& state);  // UserError on mismatch
  void set_steps(uint64_t steps) { steps_ = steps; }

  GemmHandle& gemm_handle();
  // The backward kernels of the norm and the SwiGLU that the casts fuse (fp8/norm_backward.h,
  // fp8/swiglu_backward.h): torch's unless the model supplies faster ones, as its modules do when
  // they register a site that fuses them.
  void use_backward_kernels(NormBackwardFn norm, SwigluBackwardFn swiglu);
  NormBackwardGrads norm_backward(const NormBackwardInputs& in) const;
  torch::Tensor swiglu_backward(const torch::Tensor& grad, const torch::Tensor& h) const;
  // One log line describing the recipe, the path (native / emulated / CPU) and the bf16 sites.
  std::string describe() const;

  // What the casts do to the values, for --log-fp8-stats-to-tensorboard (a drifting recipe shows
  // before it diverges). While collecting (meant for one step at a time: it costs extra passes
  // over each cast tensor), every cast adds to its site's and role's statistics: the amax of the
  // values cast (after any fused norm or activation), the elements that round to zero though they
  // are not zero (underflows), the elements cast to the largest finite FP8 magnitude (overflows:
  // saturated, or exactly at the top of the range) and the elements cast.
  void collect_stats(bool on) { collect_stats_ = on; }
  bool collecting_stats() const { return collect_stats_; }
  void record_stats(const Fp8Site& site, TensorRole role, Format format, const torch::Tensor& values,
                    const torch::Tensor& codes);
  struct CastStats {
    std::string site;
    TensorRole role;
    double amax = 0, underflows = 0, overflows = 0, elements = 0;
  };
  // The statistics gathered since the last call (waits for the device), then cleared.
  std::vector<CastStats> take_stats();

 private:
  void ensure_state();

  Fp8EngineOptions options_;
  torch::Device device_;
  bool emulated_ = false;
  std::vector<std::shared_ptr<Fp8Site>> sites_;
  int64_t bf16_sites_ = 0;
  uint64_t weight_generation_ = 0;
  uint64_t steps_ = 0;
  bool overwrite_main_grads_ = false;
  torch::Tensor history_, scale_, scale_inv_;
  AttentionScaling attention_;
  std::unique_ptr<GemmHandle> gemm_;
  NormBackwardFn norm_backward_ = nullptr;
  SwigluBackwardFn swiglu_backward_ = nullptr;
  bool collect_stats_ = false;
  // (site index, role) -> [amax, underflows, overflows, elements] (fp64, on the device)
  std::map<std::pair<size_t, int>, torch::Tensor> stats_;
};

}  // namespace fp8tron::fp8
