// The bf16 linears' backward GEMMs through our cuBLASLt gemm() (fp8/gemm.h), autotuned once per
// shape, and their bias gradients as one column-sum pass over dY (models/column_sums_kernels.h)
// instead of cuBLASLt's BGRADB epilogue.
//
// Why: at the benchmark models' shapes on an H200 (docs/benchmarks.md, session 12,
// `fp8tron_bench_dense_gemm`) ATen's heuristic choice for the input-gradient GEMMs is up to 8%
// slower than the fastest of cuBLASLt's candidates (GPT 1.3B's fc2 dgrad: 0.434 against 0.400 ms),
// and BGRADB adds 35-59 us per call where a pass over dY costs 8-25 us.
//
// An A/B switch until measured in training: FP8TRON_DENSE_GEMMS=cublaslt turns the path on (read
// once per process); by default the linears run ATen's at::mm / at::addmm and BGRADB as before.
// Where it cannot apply (the CPU, fp16, non-contiguous or misaligned operands) the functions run
// ATen's calls either way. Autotuned choices may differ between runs (the FP8 GEMMs' default too);
// FP8TRON_GEMM_AUTOTUNE=0, which --deterministic-mode sets, keeps the heuristic's first choice.
#pragma once
#include <torch/torch.h>

#include <cstdint>

namespace fp8tron {

// Whether the path is on: FP8TRON_DENSE_GEMMS=cublaslt in the environment, or the tests' setter.
bool dense_gemms_through_cublaslt();
void set_dense_gemms_through_cublaslt(bool on);
// How many GEMMs and column sums the path has run in this process (tests check that it runs).
uint64_t dense_gemm_calls();

// dX [rows, in] = dY [rows, out] W [out, in]: at::mm(dy, weight), or our autotuned GEMM.
torch::Tensor linear_dgrad(const torch::Tensor& dy, const torch::Tensor& weight);

// Whether dense_wgrad()/dense_bias_grad() apply to these operands (the switch on, a GPU, bf16,
// contiguous [tokens, features] matrices, 16-byte aligned, features a multiple of 8).
bool dense_param_grads_apply(const torch::Tensor& dy, const torch::Tensor& x);

// main_grad [out, in] fp32 (+)= dY^T X in fp32: written when `overwrite` (a step's first write),
// else accumulated. Only where dense_param_grads_apply().
void dense_wgrad(const torch::Tensor& dy, const torch::Tensor& x, torch::Tensor& main_grad, bool overwrite);

// bias_main_grad [out] fp32 (+)= the column sums of dY: written when `overwrite`, else added.
// Only where dense_param_grads_apply().
void dense_bias_grad(const torch::Tensor& dy, torch::Tensor& bias_main_grad, bool overwrite);

}  // namespace fp8tron
