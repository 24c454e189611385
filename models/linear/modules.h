// Transformer-Engine-named building blocks, tensor- and sequence-parallel, under TE's parameter
// names (layer_norm_weight, weight, bias) so that state dicts read like Megatron-Core's.
// Activations are [sequence, batch, hidden]; with sequence parallelism, tensors outside the
// column/row pair are split along the sequence. Each linear decides how it runs when it is built
// (models/linear/linear_plan.h):
//   models/norm/te_layer_norm.h                        TELayerNorm
//   models/linear/column_parallel_linear.h             TEColumnParallelLinear
//   models/linear/layer_norm_column_parallel_linear.h  TELayerNormColumnParallelLinear
//   models/linear/row_parallel_linear.h                TERowParallelLinear
// and the paths their plans name: models/linear/fused_linear.h (bf16 with gradient-accumulation
// fusion), fp8/fp8_linear.h (FP8), models/linear/overlapped_linear.h (the communicating op),
// models/linear/norm_linear.h, models/mlp/fused_swiglu.h and models/mlp/fused_gelu_mlp.h.
#pragma once
#include <torch/torch.h>

#include <string>
#include <utility>
#include <vector>

#include "models/linear/column_parallel_linear.h"
#include "models/linear/layer_norm_column_parallel_linear.h"
#include "models/linear/linear_options.h"
#include "models/linear/linear_plan.h"
#include "models/linear/row_parallel_linear.h"
#include "models/norm/te_layer_norm.h"

namespace fp8tron {

// The weights and biases of the bf16 linears under `model` whose gradients only their own GEMMs
// produce: the plain path (no FP8, not the overlapped op), not a shared weight, and the bias in the
// GEMM or left to the next norm (not added after a tensor-parallel reduction). Where
// gradient-accumulation fusion applies, a step's first wgrad GEMM may write their main gradients
// (models/linear/main_grads.h).
std::vector<torch::Tensor> gemm_written_params(const torch::nn::Module& model);

// Every linear of `model` with its plan, by global module name (--print-model-plan).
std::vector<std::pair<std::string, LinearPlan>> linear_plans(const torch::nn::Module& model);

}  // namespace fp8tron
