// The pieces of the FP8 linear (fp8_linear.h; the quantized tensors and quantizers of
// quantized_tensor.h) for linears that run their GEMMs on row blocks and move quantized rows
// between ranks: the communicating op of parallel/overlap, through
// models/linear/linear_kernels_fp8.h. The same quantizers, GEMMs and weight cache as fp8_linear, so a
// linear computed in pieces from the same codes and scales gives the same products. fp8/ knows
// nothing of process groups: a cross-rank amax reduction is a callback (AmaxReducer).
#pragma once
#include <torch/torch.h>

#include <memory>
#include <vector>

#include "fp8/fp8_linear.h"
#include "fp8/quantize.h"
#include "fp8/quantized_tensor.h"
#include "fp8/recipe.h"

namespace fp8tron::fp8 {

// Quantizes x2d [rows, cols] for `role` of `site` as fp8_linear does: the row-wise copy and/or the
// transposed copy, recording the amax (delayed scaling) when `record_amax`. With tensorwise
// (current) scaling and `reduce_amax`, x2d is one rank's part of a larger tensor: its amax is
// handed to reduce_amax (a 1-element fp32 tensor on x2d's device, to be replaced by the whole's,
// e.g. a MAX all-reduce over the tensor-parallel group) before the scale is taken, so the codes
// and scale equal those of quantizing the whole tensor.
std::shared_ptr<Quantized> quantize_rows(Fp8Engine& engine, const Fp8Site& site, TensorRole role, torch::Tensor x2d,
                                         bool rowwise, bool transposed, bool record_amax, TensorCastFusion fusion = {},
                                         const AmaxReducer* reduce_amax = nullptr);

// The row-wise copy of quantized rows received from another rank: codes [rows, cols] and their
// scale_inv; without one (tensor scaling) `like`'s, which is equal on every rank.
std::shared_ptr<Quantized> rowwise_from_codes(Fp8Engine& engine, const Quantized& like, torch::Tensor codes,
                                              torch::Tensor scale_inv);
// Rows [begin, begin + count) of the row-wise copy (block scales re-laid out for the smaller
// matrix; 128x128 blocks need begin % 128 == 0).
std::shared_ptr<Quantized> slice_rows(Fp8Engine& engine, const Quantized& q, int64_t begin, int64_t count);
// Columns [begin, begin + count) of a weight, as its transposed copy's rows (dgrad on a column
// split); 128x128 blocks need begin % 128 == 0.
std::shared_ptr<Quantized> slice_cols_transposed(Fp8Engine& engine, const Quantized& q, int64_t begin, int64_t count);
// The transposed copy of the row blocks joined in order, from their tensor-scaled row-wise codes:
// a byte transpose, the same codes as quantizing the joined tensor's transposed copy.
std::shared_ptr<Quantized> transposed_from_rowwise_blocks(Fp8Engine& engine, const std::vector<const Quantized*>& blocks);

// out = A B^T (+ bias) as fp8_linear's GEMMs (A, B the row-wise or transposed copies); with
// `accumulate_into` (fp32, native path) added into it instead (wgrad into a main gradient).
// `sm_count` > 0 caps a native GEMM's SMs (it runs beside SM-based communication; 0: all).
torch::Tensor fp8_gemm(Fp8Engine& engine, const Quantized& a, bool a_transposed, const Quantized& b, bool b_transposed,
                       const torch::Tensor& bias, GemmKind kind, torch::ScalarType out_dtype,
                       const torch::Tensor& accumulate_into = {}, bool overwrite = false, int sm_count = 0);

// --fp8-param-gather: both copies of a tensor-scaled weight from the site's gathered codes (the
// transposed copy is their byte transpose) and dequantization factor.
std::shared_ptr<Quantized> weight_from_codes(Fp8Engine& engine, const Fp8Site& site);

// (The weight of the current optimizer step: quantized_weight, quantized_tensor.h.)

// The high-precision values of a copy (fp32 on the CPU, bf16 on the GPU).
torch::Tensor dequantized_copy(Fp8Engine& engine, const Quantized& q, bool transposed);

// UserError unless `rows` is a multiple of 16 (FP8 GEMM leading dimensions).
void check_fp8_rows(const Fp8Site& site, int64_t rows);

}  // namespace fp8tron::fp8
