// Number formats: the parameter dtype, fp16 loss scaling, and FP8 (--fp8-format, --fp8-recipe and
// friends). The FP8 recipes are typed values here; fp8/recipe.h gives them their behaviour
// (validation, per-tensor formats, scaling modes), the fp8/ engine applies them.
#pragma once
#include <cstdint>
#include <optional>
#include <variant>

namespace fp8tron {

enum class ParamDtype { Fp32, Bf16, Fp16 };

namespace fp8 {

enum class Fp8Format : uint8_t { kE4M3, kHybrid, kHiF8 };
enum class RecipeKind : uint8_t { kDelayed, kTensorwise, kBlockwise, kMxfp8 };
enum class AmaxComputeAlgo : uint8_t { kMax, kMostRecent };

// Defaults are Megatron-LM's (--fp8-margin 0, --fp8-interval 1, --fp8-amax-history-len 1,
// --fp8-amax-compute-algo most_recent); Transformer Engine's own defaults are 1024 / max.
struct DelayedScaling {
  Fp8Format format = Fp8Format::kHybrid;
  int margin = 0;            // scale = (fp8_max / amax) / 2^margin
  int interval = 1;          // update scales every `interval` steps
  int amax_history_len = 1;  // steps of amax history kept per tensor
  AmaxComputeAlgo amax_compute_algo = AmaxComputeAlgo::kMostRecent;
  bool reduce_amax = true;   // all-reduce amaxes over the tensor-parallel group
};

struct CurrentScaling {
  Fp8Format format = Fp8Format::kHybrid;
  bool power_2_scales = false;  // round scales down to a power of two
  float amax_epsilon = 0.0f;    // floor for amax before computing the scale
};

struct BlockwiseScaling {
  Fp8Format format = Fp8Format::kE4M3;  // E4M3, or hybrid (E5M2 gradients) as Transformer Engine allows
  bool power_2_scales = true;           // TE's default for block scaling
  float amax_epsilon = 0.0f;
};

struct Mxfp8Scaling {
  Fp8Format format = Fp8Format::kE4M3;  // E4M3 or hybrid
};

using Recipe = std::variant<DelayedScaling, CurrentScaling, BlockwiseScaling, Mxfp8Scaling>;

}  // namespace fp8

// FP8 linear layers (--fp8-format and friends). Off when `recipe` is empty.
struct Fp8Config {
  std::optional<fp8::Recipe> recipe;
  bool tp_only_amax_reduction = false;  // --tp-only-amax-red: amaxes reduced over TP only, not TP x DP
  int64_t bf16_first_layers = 0;        // --first-last-layers-bf16 with --num-layers-at-start-in-bf16
  int64_t bf16_last_layers = 0;         //                             and --num-layers-at-end-in-bf16
  int64_t min_features = 0;             // --fp8-min-features: smaller linears stay bf16
  bool grouped_gemm_fp8 = true;         // !--no-use-gmm-fp8: TEGroupedLinear's use_fp8 (MoE experts)
  bool param_gather = false;            // --fp8-param-gather: the optimizer publishes FP8 weights
  bool keep_transposes = true;          // --fp8-transposes keep (or recast: fp8/fp8_engine.h)
  bool wgrad = true;                    // !--no-fp8-wgrad: the weight-gradient GEMMs in FP8 too
  bool dot_product_attention = false;   // --fp8-dot-product-attention: the core attention in FP8
  bool attention_emulated = false;      // --fp8tron-test-fp8-attention-emulated (tests: the GPU reference)
  // Whether the FP8 GEMMs time their cuBLASLt candidates on first use (fp8/gemm.h): on unless
  // FP8TRON_GEMM_AUTOTUNE=0 or --deterministic-mode (the heuristic's first choice, the same
  // kernels in every run).
  bool gemm_autotune = true;
  bool enabled() const { return recipe.has_value(); }
};

struct PrecisionConfig {
  ParamDtype params_dtype = ParamDtype::Fp32;
  Fp8Config fp8;
  bool grads_in_fp32 = true;                 // main gradients accumulate in fp32
  // !--no-gradient-accumulation-fusion: wgrad GEMMs accumulate into the fp32 main gradients
  bool gradient_accumulation_fusion = true;
  std::optional<double> static_loss_scale;   // --loss-scale
  double initial_loss_scale = 4294967296.0;
  double min_loss_scale = 1.0;
  int64_t loss_scale_window = 1000;
  int hysteresis = 2;
  bool dynamic_loss_scale() const { return params_dtype == ParamDtype::Fp16 && !static_loss_scale; }
};

}  // namespace fp8tron
