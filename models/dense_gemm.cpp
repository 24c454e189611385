#include "models/dense_gemm.h"

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <array>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "core/error.h"
#include "fp8/gemm.h"
#include "models/column_sums_kernels.h"

namespace fp8tron {
namespace {

// One autotuning handle per device, created on first use and kept for the process (the grouped
// GEMMs' heuristic handle keeps its bucketed plans apart): a dense model's shapes are fixed, so
// each is timed once, in the first step.
fp8::GemmHandle& dense_gemm_handle() {
  constexpr int kMaxDevices = 64;
  static std::array<fp8::GemmHandle*, kMaxDevices> handles{};
  static std::mutex mutex;
  const int device = c10::cuda::current_device();
  FP8TRON_CHECK(device >= 0 && device < kMaxDevices, "dense GEMMs: device index out of range");
  std::lock_guard<std::mutex> lock(mutex);
  // Never destroyed: at exit the CUDA context may already be gone.
  if (!handles[size_t(device)]) {
    fp8::GemmHandleOptions options;
    options.algo_selection = fp8::AlgoSelection::kAutotune;
    options.max_candidates = 8;
    handles[size_t(device)] = new fp8::GemmHandle(options);
  }
  return *handles[size_t(device)];
}

CUstream_st* stream_of(const torch::Tensor& t) { return c10::cuda::getCurrentCUDAStream(t.device().index()).stream(); }

bool aligned16(const torch::Tensor& t) { return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0; }

bool bf16_matrix(const torch::Tensor& t) {
  return t.is_cuda() && t.scalar_type() == torch::kBFloat16 && t.dim() == 2 && t.is_contiguous() && aligned16(t) &&
         t.size(1) % 8 == 0;
}

// A row-major [rows, cols] bf16 matrix as gemm.h's column-major operand (cols x rows, ld cols).
fp8::GemmOperand operand(const torch::Tensor& t, bool transposed) {
  return {t.data_ptr(), fp8::DType::kBF16, t.size(1), t.size(0), t.size(1), transposed};
}

std::atomic<bool>& switch_state() {
  static std::atomic<bool> on = [] {
    const char* v = std::getenv("FP8TRON_DENSE_GEMMS");
    return v != nullptr && std::strcmp(v, "cublaslt") == 0;
  }();
  return on;
}

std::atomic<uint64_t> calls{0};

}  // namespace

bool dense_gemms_through_cublaslt() { return switch_state().load(); }
void set_dense_gemms_through_cublaslt(bool on) { switch_state().store(on); }
uint64_t dense_gemm_calls() { return calls.load(); }

torch::Tensor linear_dgrad(const torch::Tensor& dy, const torch::Tensor& weight) {
  if (!dense_gemms_through_cublaslt() || !bf16_matrix(dy) || !bf16_matrix(weight) || dy.size(1) != weight.size(0))
    return at::mm(dy, weight);
  const c10::cuda::CUDAGuard device(dy.device());
  const int64_t rows = dy.size(0), in = weight.size(1);
  auto dx = torch::empty({rows, in}, dy.options());
  if (rows == 0) return dx;
  // Column-major: dX^T (in x rows) = W as stored (in x out) * dY^T as stored (out x rows).
  const fp8::GemmOutput d{dx.data_ptr(), fp8::DType::kBF16, in};
  fp8::gemm(dense_gemm_handle(), operand(weight, false), operand(dy, false), d, fp8::GemmConfig{}, stream_of(dy));
  ++calls;
  return dx;
}

bool dense_param_grads_apply(const torch::Tensor& dy, const torch::Tensor& x) {
  // No tokens: ATen's calls write or keep the zeros (gemm() takes no empty dimension).
  return dense_gemms_through_cublaslt() && bf16_matrix(dy) && bf16_matrix(x) && dy.size(0) == x.size(0) &&
         x.size(0) > 0;
}

void dense_wgrad(const torch::Tensor& dy, const torch::Tensor& x, torch::Tensor& main_grad, bool overwrite) {
  FP8TRON_CHECK(dense_param_grads_apply(dy, x) && main_grad.scalar_type() == torch::kFloat32 && main_grad.is_contiguous() &&
                    main_grad.dim() == 2 && main_grad.size(0) == dy.size(1) && main_grad.size(1) == x.size(1),
                "dense_wgrad: operands it does not take");
  const c10::cuda::CUDAGuard device(x.device());
  const int64_t in = x.size(1);
  // Column-major: main_grad (in x out) (+)= X as stored (in x tokens) * (dY as stored)^T (tokens x out).
  const fp8::GemmOutput d{main_grad.data_ptr(), fp8::DType::kFP32, in};
  fp8::GemmConfig config;
  config.accumulate = !overwrite;
  fp8::gemm(dense_gemm_handle(), operand(x, false), operand(dy, true), d, config, stream_of(x));
  ++calls;
}

void dense_bias_grad(const torch::Tensor& dy, torch::Tensor& bias_main_grad, bool overwrite) {
  FP8TRON_CHECK(bf16_matrix(dy) && bias_main_grad.scalar_type() == torch::kFloat32 && bias_main_grad.is_contiguous() &&
                    bias_main_grad.numel() == dy.size(1),
                "dense_bias_grad: operands it does not take");
  const c10::cuda::CUDAGuard device(dy.device());
  const int64_t rows = dy.size(0), cols = dy.size(1);
  auto scratch = torch::empty({std::max<int64_t>(1, kernels::column_sums_scratch_floats(rows, cols))},
                              dy.options().dtype(torch::kFloat32));
  kernels::column_sums_bf16(dy.data_ptr(), rows, cols, scratch.data_ptr<float>(), bias_main_grad.data_ptr<float>(),
                            !overwrite, stream_of(dy));
  ++calls;
}

}  // namespace fp8tron
