#include "fp8/recipe.h"

#include <type_traits>

#include "core/error.h"
#include "core/text.h"

namespace fp8tron::fp8 {

namespace {

template <class... Ts>
struct Overloaded : Ts... {
  using Ts::operator()...;
};
template <class... Ts>
Overloaded(Ts...) -> Overloaded<Ts...>;

std::string suggestion(const std::string& value, const std::vector<std::string>& choices) {
  const std::string hint = closest_match(value, choices);
  return hint.empty() ? std::string() : "; did you mean '" + hint + "'?";
}

}  // namespace

const char* tensor_role_name(TensorRole role) {
  switch (role) {
    case TensorRole::kInput: return "input";
    case TensorRole::kWeight: return "weight";
    case TensorRole::kOutput: return "output";
    case TensorRole::kGradOutput: return "grad_output";
    case TensorRole::kGradInput: return "grad_input";
  }
  return "?";
}

const char* recipe_kind_name(RecipeKind kind) {
  switch (kind) {
    case RecipeKind::kDelayed: return "delayed";
    case RecipeKind::kTensorwise: return "tensorwise";
    case RecipeKind::kBlockwise: return "blockwise";
    case RecipeKind::kMxfp8: return "mxfp8";
  }
  return "?";
}

const char* fp8_format_name(Fp8Format format) {
  switch (format) {
    case Fp8Format::kE4M3: return "e4m3";
    case Fp8Format::kHybrid: return "hybrid";
    case Fp8Format::kHiF8: return "hif8";
  }
  return "?";
}

const char* amax_compute_algo_name(AmaxComputeAlgo algo) {
  return algo == AmaxComputeAlgo::kMax ? "max" : "most_recent";
}

RecipeKind parse_recipe_kind(const std::string& value) {
  if (value == "delayed") return RecipeKind::kDelayed;
  if (value == "tensorwise") return RecipeKind::kTensorwise;
  if (value == "blockwise") return RecipeKind::kBlockwise;
  if (value == "mxfp8") return RecipeKind::kMxfp8;
  throw UserError("--fp8-recipe: unknown recipe '" + value + "' (expected delayed, tensorwise, blockwise or mxfp8)" +
                  suggestion(value, {"delayed", "tensorwise", "blockwise", "mxfp8"}));
}

Fp8Format parse_fp8_format(const std::string& value) {
  if (value == "e4m3") return Fp8Format::kE4M3;
  if (value == "hybrid") return Fp8Format::kHybrid;
  if (value == "hif8") return Fp8Format::kHiF8;
  throw UserError("--fp8-format: unknown format '" + value + "' (expected e4m3, hybrid or hif8)" +
                  suggestion(value, {"e4m3", "hybrid", "hif8"}));
}

AmaxComputeAlgo parse_amax_compute_algo(const std::string& value) {
  if (value == "max") return AmaxComputeAlgo::kMax;
  if (value == "most_recent") return AmaxComputeAlgo::kMostRecent;
  throw UserError("--fp8-amax-compute-algo: unknown algorithm '" + value + "' (expected max or most_recent)" +
                  suggestion(value, {"max", "most_recent"}));
}

RecipeKind recipe_kind(const Recipe& recipe) {
  return std::visit(Overloaded{[](const DelayedScaling&) { return RecipeKind::kDelayed; },
                               [](const CurrentScaling&) { return RecipeKind::kTensorwise; },
                               [](const BlockwiseScaling&) { return RecipeKind::kBlockwise; },
                               [](const Mxfp8Scaling&) { return RecipeKind::kMxfp8; }},
                    recipe);
}

Fp8Format recipe_format(const Recipe& recipe) {
  return std::visit([](const auto& r) { return r.format; }, recipe);
}

void validate(const Recipe& recipe) {
  const RecipeKind kind = recipe_kind(recipe);
  const Fp8Format format = recipe_format(recipe);
  if (format == Fp8Format::kHiF8 && kind != RecipeKind::kTensorwise) {
    throw UserError(std::string("--fp8-format hif8 requires --fp8-recipe tensorwise (HiF8 is defined for per-tensor "
                                "current scaling only), got --fp8-recipe ") +
                    recipe_kind_name(kind));
  }
  std::visit(Overloaded{
                 [](const DelayedScaling& r) {
                   if (r.margin < 0) throw UserError(strprintf("--fp8-margin must be >= 0, got %d", r.margin));
                   if (r.interval < 1) throw UserError(strprintf("--fp8-interval must be >= 1, got %d", r.interval));
                   if (r.amax_history_len < 1) {
                     throw UserError(strprintf("--fp8-amax-history-len must be >= 1, got %d", r.amax_history_len));
                   }
                 },
                 [](const CurrentScaling& r) {
                   if (!(r.amax_epsilon >= 0.0f)) throw UserError("tensorwise recipe: amax epsilon must be >= 0");
                 },
                 [](const BlockwiseScaling& r) {
                   // Transformer Engine's Float8BlockScaling: E4M3, or hybrid (E5M2 gradients); not HiF8.
                   if (r.format != Fp8Format::kE4M3 && r.format != Fp8Format::kHybrid) {
                     throw UserError(std::string("--fp8-recipe blockwise takes --fp8-format e4m3 or hybrid, got "
                                                 "--fp8-format ") +
                                     fp8_format_name(r.format));
                   }
                   if (!(r.amax_epsilon >= 0.0f)) throw UserError("blockwise recipe: amax epsilon must be >= 0");
                 },
                 [](const Mxfp8Scaling&) {},
             },
             recipe);
}

Format tensor_format(Fp8Format format, TensorRole role) {
  switch (format) {
    case Fp8Format::kE4M3: return Format::kE4M3;
    case Fp8Format::kHybrid: return is_backward(role) ? Format::kE5M2 : Format::kE4M3;
    case Fp8Format::kHiF8: return Format::kHiF8;
  }
  return Format::kE4M3;
}

Format tensor_format(const Recipe& recipe, TensorRole role) { return tensor_format(recipe_format(recipe), role); }

ScalingMode scaling_mode(const Recipe& recipe, TensorRole role) {
  switch (recipe_kind(recipe)) {
    case RecipeKind::kDelayed:
    case RecipeKind::kTensorwise: return ScalingMode::kTensor;
    case RecipeKind::kBlockwise:
      return role == TensorRole::kWeight ? ScalingMode::kBlock128x128 : ScalingMode::kBlock1x128;
    case RecipeKind::kMxfp8: return ScalingMode::kMxfp8;
  }
  return ScalingMode::kTensor;
}

bool use_fast_accumulation(const Recipe& recipe, GemmKind gemm) {
  const RecipeKind kind = recipe_kind(recipe);
  if (kind == RecipeKind::kDelayed || kind == RecipeKind::kTensorwise) return gemm == GemmKind::kFprop;
  return false;
}

bool runs_natively(const Recipe& recipe, int compute_capability_major) {
  if (recipe_format(recipe) == Fp8Format::kHiF8) return false;
  switch (recipe_kind(recipe)) {
    case RecipeKind::kDelayed:
    case RecipeKind::kTensorwise: return compute_capability_major >= 9;  // sm_89 too, but we build for 90a
    case RecipeKind::kBlockwise: return compute_capability_major == 9;
    case RecipeKind::kMxfp8: return compute_capability_major >= 10;
  }
  return false;
}

std::string emulation_notice(const Recipe& recipe, int compute_capability_major) {
  if (runs_natively(recipe, compute_capability_major)) return "";
  if (recipe_format(recipe) == Fp8Format::kHiF8) {
    return "FP8: HiF8 has no NVIDIA tensor-core support; emulating it exactly (tensors quantized to the HiF8 value "
           "set with round-half-away rounding, dequantized, then bf16 GEMMs)";
  }
  if (recipe_kind(recipe) == RecipeKind::kMxfp8) {
    return strprintf("FP8: MXFP8 needs Blackwell (sm_100+) tensor cores, this GPU is sm_%d; emulating it (1x32 E8M0 "
                     "block quantization, dequantize, bf16 GEMMs)",
                     compute_capability_major * 10);
  }
  return strprintf("FP8: recipe %s has no FP8 GEMM path on sm_%d; emulating it (quantize, dequantize, bf16 GEMMs)",
                   recipe_kind_name(recipe_kind(recipe)), compute_capability_major * 10);
}

size_t fp8_token_alignment(const Recipe& recipe) { return recipe_kind(recipe) == RecipeKind::kMxfp8 ? 32 : 16; }

std::string describe(const Recipe& recipe) {
  return std::visit(
      Overloaded{
          [](const DelayedScaling& r) {
            return strprintf("delayed scaling, format %s, margin %d, interval %d, amax history %d (%s)%s",
                             fp8_format_name(r.format), r.margin, r.interval, r.amax_history_len,
                             amax_compute_algo_name(r.amax_compute_algo),
                             r.reduce_amax ? ", amaxes shared over the amax group (tensor x data parallel, or --tp-only-amax-red)" : "");
          },
          [](const CurrentScaling& r) {
            return strprintf("tensorwise current scaling, format %s%s", fp8_format_name(r.format),
                             r.power_2_scales ? ", power-of-two scales" : "");
          },
          [](const BlockwiseScaling& r) {
            return strprintf("blockwise scaling, format %s, 1x128 activation/gradient tiles, 128x128 weight blocks%s",
                             fp8_format_name(r.format), r.power_2_scales ? ", power-of-two scales" : "");
          },
          [](const Mxfp8Scaling& r) {
            return strprintf("MXFP8 block scaling, format %s, 1x32 blocks with E8M0 scales", fp8_format_name(r.format));
          },
      },
      recipe);
}

Recipe make_recipe(RecipeKind kind, Fp8Format format, int margin, int interval, int amax_history_len,
                   AmaxComputeAlgo amax_compute_algo) {
  Recipe recipe;
  switch (kind) {
    case RecipeKind::kDelayed: {
      DelayedScaling r;
      r.format = format;
      r.margin = margin;
      r.interval = interval;
      r.amax_history_len = amax_history_len;
      r.amax_compute_algo = amax_compute_algo;
      recipe = r;
      break;
    }
    case RecipeKind::kTensorwise: {
      CurrentScaling r;
      r.format = format;
      recipe = r;
      break;
    }
    case RecipeKind::kBlockwise: {
      BlockwiseScaling r;
      r.format = format;
      recipe = r;
      break;
    }
    case RecipeKind::kMxfp8: {
      Mxfp8Scaling r;
      r.format = format;
      recipe = r;
      break;
    }
  }
  validate(recipe);
  return recipe;
}

}  // namespace fp8tron::fp8
