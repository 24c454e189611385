// FP8 recipes as typed values, with Transformer Engine's semantics and Megatron's flag names.
//
//   DelayedScaling   --fp8-recipe delayed: per-tensor scale from an amax history (margin, interval,
//                    history length, max | most_recent), updated after each step; amaxes are
//                    reduced over the tensor-parallel group in one all-reduce (scaling_state.h).
//   CurrentScaling   --fp8-recipe tensorwise: per-tensor scale from the tensor's own amax, taken just
//                    before the cast. The only recipe that accepts HiF8.
//   BlockwiseScaling --fp8-recipe blockwise: 1x128 blocks for activations and gradients, 128x128 for
//                    weights, fp32 scales (powers of two by default), E4M3 throughout (DeepSeek-V3).
//   Mxfp8Scaling     --fp8-recipe mxfp8: 1x32 blocks with E8M0 scales (OCP MX). Hopper has no MX
//                    tensor cores: runs emulated (quantize, dequantize, bf16 GEMM).
//
// --fp8-format: e4m3 (all tensors E4M3), hybrid (E4M3 forward, E5M2 gradients), hif8 (Ascend
// HiFloat8 for all tensors; emulated on every NVIDIA GPU).
#pragma once
#include <cstdint>
#include <string>
#include <variant>

#include "core/config/precision_config.h"  // the recipe types: DelayedScaling, ..., Recipe
#include "fp8/formats.h"
#include "fp8/fp8_tensor.h"

namespace fp8tron::fp8 {

// The quantized tensors of one linear layer, as Transformer Engine's fp8 meta: the forward pass has
// input, weight, output; the backward pass grad_output and grad_input.
enum class TensorRole : uint8_t { kInput, kWeight, kOutput, kGradOutput, kGradInput };
constexpr bool is_backward(TensorRole role) {
  return role == TensorRole::kGradOutput || role == TensorRole::kGradInput;
}
const char* tensor_role_name(TensorRole role);

// The three GEMMs of a linear layer: Y = X W^T (fprop), dX = dY W (dgrad), dW = dY^T X (wgrad).
enum class GemmKind : uint8_t { kFprop, kDgrad, kWgrad };

// Throws UserError naming the flags when the combination is invalid.
void validate(const Recipe& recipe);

RecipeKind recipe_kind(const Recipe& recipe);
Fp8Format recipe_format(const Recipe& recipe);

// Element format of a tensor: E4M3 forward; backward E5M2 under hybrid, else as forward; HiF8
// everywhere under hif8.
Format tensor_format(Fp8Format format, TensorRole role);
Format tensor_format(const Recipe& recipe, TensorRole role);
ScalingMode scaling_mode(const Recipe& recipe, TensorRole role);

// Fast (reduced-precision) FP8 accumulation, as TE: fprop only for per-tensor recipes; never for
// block scaling (which requires split accumulation).
bool use_fast_accumulation(const Recipe& recipe, GemmKind gemm);

// Whether the recipe's GEMMs run on FP8 tensor cores on a GPU of this compute capability, or are
// emulated (quantize -> dequantize -> bf16 GEMM). MXFP8 is native from sm_100, HiF8 nowhere on
// NVIDIA GPUs, blockwise needs sm_90 (cuBLASLt 12.9+ block-scaled modes).
bool runs_natively(const Recipe& recipe, int compute_capability_major);
// One line for the log when the recipe is emulated on that GPU; "" when native.
std::string emulation_notice(const Recipe& recipe, int compute_capability_major);

// Grouped GEMMs (MoE experts): the multiple each expert's token count is padded to inside the
// grouped linear, Megatron's get_fp8_align_size: 32 for MXFP8 (its 1x32 blocks run along the
// tokens in the wgrad operands), 16 otherwise (FP8 GEMM leading dimensions).
size_t fp8_token_alignment(const Recipe& recipe);

// One line describing the recipe, for the startup log.
std::string describe(const Recipe& recipe);

// Flag values -> typed values (UserError with a suggestion on a typo).
RecipeKind parse_recipe_kind(const std::string& value);       // --fp8-recipe
Fp8Format parse_fp8_format(const std::string& value);         // --fp8-format
AmaxComputeAlgo parse_amax_compute_algo(const std::string& value);  // --fp8-amax-compute-algo
const char* recipe_kind_name(RecipeKind kind);
const char* fp8_format_name(Fp8Format format);
const char* amax_compute_algo_name(AmaxComputeAlgo algo);

// Builds and validates the recipe from Megatron's flags; options that do not apply to the chosen
// recipe are ignored, as in Megatron.
Recipe make_recipe(RecipeKind kind, Fp8Format format, int margin = 0, int interval = 1, int amax_history_len = 1,
                   AmaxComputeAlgo amax_compute_algo = AmaxComputeAlgo::kMostRecent);

}  // namespace fp8tron::fp8
