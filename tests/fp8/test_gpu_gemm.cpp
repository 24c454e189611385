// cuBLASLt GEMMs against a reference GEMM of the dequantized operands (exact products summed in
// double), for every FP8 operand pairing, fast and split accumulation, bf16/fp32 output, bias,
// accumulation into D, block-scaled operands, and the throughput of the 16384x8192x2048 FP8 GEMM
// against the bf16 cuBLASLt GEMM of the same shape (printed as "[fp8-bench] ..." lines).
//
// Tolerance, element-wise: |D - ref| <= out_rel * |ref| + acc_rel * sum_k |x_mk * w_nk|
//   out_rel = 2^-8 for bf16 output (half an ulp is 2^-9), 2^-20 for fp32 output;
//   acc_rel = 2^-12 with split accumulation, 2^-8 with Hopper's fast accumulation. Hopper's FP8
//   tensor cores add products with roughly 14 bits of alignment precision; split accumulation
//   promotes partial sums to fp32 regularly, fast accumulation does not (DeepSeek-V3 measured ~2%
//   relative error at K = 4096 without promotion). Layout or scale bugs give O(1) errors.
// The observed worst ratio |D - ref| / (that bound) is printed for each case.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "fp8/format_codec.h"
#include "fp8/formats.h"
#include "fp8/gemm.h"
#include "fp8/quantize_reference.h"
#include "gpu_test_util.h"

namespace fp8tron::fp8 {
namespace {

using testing::DeviceBuffer;
using testing::HostQuantized;
using testing::random_bf16;

// Host copy of a quantized operand and its device twin.
struct Operand {
  std::unique_ptr<HostQuantized> host;
  std::vector<float> values;    // dequantized row-wise copy [rows, cols]
  std::vector<float> values_t;  // dequantized transposed copy [cols, rows]
  std::unique_ptr<DeviceBuffer<uint8_t>> data, data_t, sinv, sinv_t;
  Fp8TensorView view;  // device pointers
};

Operand make_operand(ScalingMode mode, Format f, size_t rows, size_t cols, uint32_t seed, float stddev = 1.0f) {
  Operand op;
  const auto x = random_bf16(rows * cols, seed, stddev, mode == ScalingMode::kTensor ? 2 : 6);
  op.host = std::make_unique<HostQuantized>(mode, f, rows, cols);
  if (mode == ScalingMode::kTensor) {
    reference::quantize_tensor_current(x.data(), op.host->view, {});
  } else {
    reference::quantize_blockwise(x.data(), op.host->view, {});
  }
  op.values.resize(rows * cols);
  op.values_t.resize(rows * cols);
  reference::dequantize_to_float(op.host->view, false, op.values.data());
  reference::dequantize_to_float(op.host->view, true, op.values_t.data());
  op.data = std::make_unique<DeviceBuffer<uint8_t>>(op.host->data);
  op.data_t = std::make_unique<DeviceBuffer<uint8_t>>(op.host->data_t);
  op.sinv = std::make_unique<DeviceBuffer<uint8_t>>(op.host->scale_inv);
  op.sinv_t = std::make_unique<DeviceBuffer<uint8_t>>(op.host->scale_inv_t);
  op.view = op.host->view;
  op.view.data = op.data->get();
  op.view.data_t = op.data_t->get();
  op.view.scale_inv = op.sinv->get();
  op.view.scale_inv_t = mode == ScalingMode::kTensor ? nullptr : op.sinv_t->get();
  op.view.scale = nullptr;
  op.view.amax = nullptr;
  return op;
}

struct Reference {
  std::vector<double> y, abs_sum;
};

// y[m, n] = sum_k x[m, k] * w[n, k]
Reference reference_nt(const std::vector<float>& x, const std::vector<float>& w, size_t M, size_t N, size_t K) {
  Reference r{std::vector<double>(M * N), std::vector<double>(M * N)};
  for (size_t m = 0; m < M; ++m) {
    for (size_t n = 0; n < N; ++n) {
      double acc = 0.0, abs_acc = 0.0;
      for (size_t k = 0; k < K; ++k) {
        const double p = static_cast<double>(x[m * K + k]) * static_cast<double>(w[n * K + k]);
        acc += p;
        abs_acc += std::fabs(p);
      }
      r.y[m * N + n] = acc;
      r.abs_sum[m * N + n] = abs_acc;
    }
  }
  return r;
}

std::vector<float> download_output(void* d, DType dtype, size_t count) {
  std::vector<float> out(count);
  if (dtype == DType::kFP32) {
    FP8TRON_CUDA_CHECK(cudaMemcpy(out.data(), d, count * 4, cudaMemcpyDeviceToHost));
  } else {
    std::vector<uint16_t> h(count);
    FP8TRON_CUDA_CHECK(cudaMemcpy(h.data(), d, count * 2, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < count; ++i) out[i] = codec::bf16_to_float(h[i]);
  }
  return out;
}

// Checks got against ref (+ extra[n] per column when given); prints the worst ratio to the bound.
// `extra_tol` widens the bound element-wise (e.g. for an earlier rounding of an accumulated D).
void check(const std::vector<float>& got, const Reference& ref, size_t N, DType out, bool fast,
           const std::string& what, const std::vector<double>* extra = nullptr,
           const std::vector<double>* extra_tol = nullptr) {
  const double out_rel = out == DType::kBF16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -20);
  const double acc_rel = fast ? std::ldexp(1.0, -8) : std::ldexp(1.0, -12);
  double worst = 0.0, max_err = 0.0;
  size_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double want = ref.y[i] + (extra ? (*extra)[i] : 0.0);
    const double err = std::fabs(static_cast<double>(got[i]) - want);
    const double bound = out_rel * std::fabs(want) + acc_rel * ref.abs_sum[i] + (extra_tol ? (*extra_tol)[i] : 0.0) +
                         1e-30;
    worst = std::max(worst, err / bound);
    max_err = std::max(max_err, err);
    if (!(err <= bound) && bad++ < 5) {
      ADD_FAILURE() << what << ": element (" << i / N << ", " << i % N << ") got " << got[i] << " want " << want
                    << " bound " << bound;
    }
  }
  EXPECT_EQ(bad, 0u) << what;
  std::printf("[fp8-gemm] %-58s max |err| %.3g, worst err/bound %.3f\n", what.c_str(), max_err, worst);
}

const char* fmt_tag(Format f) { return f == Format::kE4M3 ? "E4M3" : "E5M2"; }

class GpuGemm : public ::testing::Test {
 protected:
  void SetUp() override {
    FP8_REQUIRE_HOPPER();
    handle_ = std::make_unique<GemmHandle>();
  }
  std::unique_ptr<GemmHandle> handle_;
};

// A = W (cuBLAS's transposed operand), B = X: "A x B" below names (W format) x (X format).
TEST_F(GpuGemm, TensorScaledFp8MatchesDequantizedReference) {
  struct Case {
    size_t M, N, K;
  };
  for (Case c : {Case{256, 384, 512}, Case{200, 128, 256}}) {
    for (auto [wf, xf] : {std::pair{Format::kE4M3, Format::kE4M3}, std::pair{Format::kE4M3, Format::kE5M2},
                          std::pair{Format::kE5M2, Format::kE4M3}}) {
      const Operand x = make_operand(ScalingMode::kTensor, xf, c.M, c.K, 1000 + c.M);
      const Operand w = make_operand(ScalingMode::kTensor, wf, c.N, c.K, 2000 + c.N, 0.05f);
      const Reference ref = reference_nt(x.values, w.values, c.M, c.N, c.K);
      for (DType out : {DType::kBF16, DType::kFP32}) {
        for (bool fast : {false, true}) {
          DeviceBuffer<uint8_t> y(c.M * c.N * (out == DType::kFP32 ? 4 : 2), 0);
          GemmConfig cfg;
          cfg.fast_accumulation = fast;
          gemm_nt(*handle_, rowwise_matrix(x.view), rowwise_matrix(w.view), y.get(), out, static_cast<int64_t>(c.N), cfg,
                  nullptr);
          FP8TRON_CUDA_CHECK(cudaDeviceSynchronize());
          const std::string what = std::string(fmt_tag(wf)) + "x" + fmt_tag(xf) + " " + std::to_string(c.M) + "x" +
                                   std::to_string(c.N) + "x" + std::to_string(c.K) + " -> " + dtype_name(out) +
                                   (fast ? " fast-accum" : " split-accum");
          check(download_output(y.get(), out, c.M * c.N), ref, c.N, out, fast, what);
        }
      }
    }
  }
}

TEST_F(GpuGemm, BiasAccumulateAndAlpha) {
  const size_t M = 128, N = 256, K = 256;
  const Operand x = make_operand(ScalingMode::kTensor, Format::kE4M3, M, K, 31);
  const Operand w = make_operand(ScalingMode::kTensor, Format::kE4M3, N, K, 32, 0.05f);
  const Reference ref = reference_nt(x.values, w.values, M, N, K);
  std::vector<uint16_t> bias(N);
  std::vector<double> bias_full(M * N), twice(M * N);  // twice: what D gains beyond X W^T
  for (size_t n = 0; n < N; ++n) bias[n] = codec::float_to_bf16(0.25f * static_cast<float>(n % 7) - 0.5f);
  for (size_t i = 0; i < M * N; ++i) bias_full[i] = codec::bf16_to_float(bias[i % N]);
  DeviceBuffer<uint16_t> dbias(bias);
  DeviceBuffer<uint16_t> y(M * N, 0);
  GemmConfig cfg;
  cfg.bias = dbias.get();
  gemm_nt(*handle_, rowwise_matrix(x.view), rowwise_matrix(w.view), y.get(), DType::kBF16, N, cfg, nullptr);
  check(download_output(y.get(), DType::kBF16, M * N), ref, N, DType::kBF16, false, "E4M3xE4M3 + bias", &bias_full);
  // D += 0.5 * X W^T on top of (X W^T + bias).
  GemmConfig acc;
  acc.accumulate = true;
  acc.alpha = 0.5f;
  gemm_nt(*handle_, rowwise_matrix(x.view), rowwise_matrix(w.view), y.get(), DType::kBF16, N, acc, nullptr);
  // want = 1.5 * X W^T + bias; the first result was already rounded to bf16 once.
  std::vector<double> first_rounding(M * N);
  for (size_t i = 0; i < M * N; ++i) {
    twice[i] = bias_full[i] + 0.5 * ref.y[i];
    first_rounding[i] = std::ldexp(1.0, -9) * (std::fabs(ref.y[i]) + std::fabs(bias_full[i])) +
                        std::ldexp(1.0, -12) * ref.abs_sum[i];
  }
  check(download_output(y.get(), DType::kBF16, M * N), ref, N, DType::kBF16, false, "E4M3xE4M3 accumulate alpha 0.5",
        &twice, &first_rounding);
}

TEST_F(GpuGemm, Bf16MatchesReference) {
  const size_t M = 256, N = 384, K = 512;
  const auto xb = random_bf16(M * K, 41), wb = random_bf16(N * K, 42, 0.05f);
  std::vector<float> xf(M * K), wf(N * K);
  for (size_t i = 0; i < xf.size(); ++i) xf[i] = codec::bf16_to_float(xb[i]);
  for (size_t i = 0; i < wf.size(); ++i) wf[i] = codec::bf16_to_float(wb[i]);
  const Reference ref = reference_nt(xf, wf, M, N, K);
  DeviceBuffer<uint16_t> dx(xb), dw(wb), y(M * N, 0);
  const RowMajorMatrix x{dx.get(), DType::kBF16, static_cast<int64_t>(M), static_cast<int64_t>(K), static_cast<int64_t>(K)};
  const RowMajorMatrix w{dw.get(), DType::kBF16, static_cast<int64_t>(N), static_cast<int64_t>(K), static_cast<int64_t>(K)};
  gemm_nt(*handle_, x, w, y.get(), DType::kBF16, N, {}, nullptr);
  check(download_output(y.get(), DType::kBF16, M * N), ref, N, DType::kBF16, false, "BF16xBF16 256x384x512");
}

// The blockwise recipe's three GEMMs: activations/gradients 1x128, weights 128x128.
TEST_F(GpuGemm, BlockScaledMatchesDequantizedReference) {
  const size_t M = 256, N = 384, K = 512;
  const Operand x = make_operand(ScalingMode::kBlock1x128, Format::kE4M3, M, K, 51);          // X  [M, K]
  const Operand w = make_operand(ScalingMode::kBlock128x128, Format::kE4M3, N, K, 52, 0.05f);  // W  [N, K]
  const Operand dy = make_operand(ScalingMode::kBlock1x128, Format::kE4M3, M, N, 53);         // dY [M, N]
  auto run = [&](const RowMajorMatrix& a, const RowMajorMatrix& b, size_t rows, size_t cols) {
    DeviceBuffer<uint16_t> y(rows * cols, 0);
    gemm_nt(*handle_, a, b, y.get(), DType::kBF16, static_cast<int64_t>(cols), {}, nullptr);
    FP8TRON_CUDA_CHECK(cudaDeviceSynchronize());
    return download_output(y.get(), DType::kBF16, rows * cols);
  };
  // fprop: Y = X W^T
  check(run(rowwise_matrix(x.view), rowwise_matrix(w.view), M, N), reference_nt(x.values, w.values, M, N, K), N,
        DType::kBF16, false, "blockwise fprop 1x128 x 128x128 " + std::to_string(M) + "x" + std::to_string(N) + "x" +
                                 std::to_string(K));
  // dgrad: dX = dY W = dY (W^T)^T with W's transposed copy [K, N]
  check(run(rowwise_matrix(dy.view), transposed_matrix(w.view), M, K), reference_nt(dy.values, w.values_t, M, K, N), K,
        DType::kBF16, false, "blockwise dgrad 1x128 x 128x128(t)");
  // wgrad: dW = dY^T X = dYt (Xt)^T with both transposed copies (1x128 along M)
  check(run(transposed_matrix(dy.view), transposed_matrix(x.view), N, K),
        reference_nt(dy.values_t, x.values_t, N, K, M), K, DType::kBF16, false, "blockwise wgrad 1x128(t) x 1x128(t)");
}

TEST_F(GpuGemm, RejectsNonTnFp8AndCachesPlans) {
  const Operand x = make_operand(ScalingMode::kTensor, Format::kE4M3, 64, 128, 61);
  const Operand w = make_operand(ScalingMode::kTensor, Format::kE4M3, 64, 128, 62);
  DeviceBuffer<uint16_t> y(64 * 64, 0);
  // "NN": A stored m x k (not transposed), B stored k x n. Valid shapes, but not a Hopper FP8 layout.
  const GemmOperand a{w.view.data, DType::kE4M3, 64, 128, 64, /*transposed=*/false, w.view.scale_inv};
  const GemmOperand b{x.view.data, DType::kE4M3, 128, 64, 128, false, x.view.scale_inv};
  try {
    gemm(*handle_, a, b, GemmOutput{y.get(), DType::kBF16, 64}, {}, nullptr);
    ADD_FAILURE() << "an NN FP8 GEMM was accepted";
  } catch (const std::logic_error& e) {
    EXPECT_NE(std::string(e.what()).find("TN layout"), std::string::npos) << e.what();
  }
  // E5M2 x E5M2 has no cuBLASLt kernel.
  RowMajorMatrix x5 = rowwise_matrix(x.view), w5 = rowwise_matrix(w.view);
  x5.dtype = w5.dtype = DType::kE5M2;
  EXPECT_THROW(gemm_nt(*handle_, x5, w5, y.get(), DType::kBF16, 64, {}, nullptr), std::logic_error);
  const size_t before = handle_->cached_plans();
  for (int i = 0; i < 3; ++i) {
    gemm_nt(*handle_, rowwise_matrix(x.view), rowwise_matrix(w.view), y.get(), DType::kBF16, 64, {}, nullptr);
  }
  EXPECT_EQ(handle_->cached_plans(), before + 1);
  GemmConfig fast;
  fast.fast_accumulation = true;
  gemm_nt(*handle_, rowwise_matrix(x.view), rowwise_matrix(w.view), y.get(), DType::kBF16, 64, fast, nullptr);
  EXPECT_EQ(handle_->cached_plans(), before + 2);
  FP8TRON_CUDA_CHECK(cudaDeviceSynchronize());
}

// Throughput at the TARGETS.md shape: Y[16384, 8192] = X[16384, 2048] W[8192, 2048]^T.
TEST_F(GpuGemm, Throughput16384x8192x2048) {
  const size_t M = 16384, N = 8192, K = 2048;
  const double flops = 2.0 * M * N * K;
  std::mt19937 gen(71);
  std::uniform_int_distribution<int> code(0, 0x77);  // finite E4M3/E5M2 magnitudes, no NaN/inf
  auto random_codes = [&](size_t n) {
    std::vector<uint8_t> v(n);
    for (auto& c : v) c = static_cast<uint8_t>(code(gen) | (gen() & 0x80u));
    return v;
  };
  DeviceBuffer<uint8_t> x8(random_codes(M * K)), w8(random_codes(N * K));
  DeviceBuffer<float> one(std::vector<float>{1.0f / 64});
  DeviceBuffer<uint16_t> xb(random_bf16(M * K, 72)), wb(random_bf16(N * K, 73));
  DeviceBuffer<uint16_t> y(M * N);
  const std::vector<float> block_ones(std::max(scale_layout(ScalingMode::kBlock1x128, M, K).elements(),
                                               scale_layout(ScalingMode::kBlock128x128, N, K).elements()),
                                      1.0f / 64);
  DeviceBuffer<float> xs(block_ones), ws(block_ones);
  const auto m64 = static_cast<int64_t>(M), n64 = static_cast<int64_t>(N), k64 = static_cast<int64_t>(K);

  auto tflops = [&](const RowMajorMatrix& x, const RowMajorMatrix& w, const GemmConfig& cfg) {
    const double ms = testing::time_ms([&] { gemm_nt(*handle_, x, w, y.get(), DType::kBF16, n64, cfg, nullptr); }, 10, 50);
    return flops / (ms * 1e-3) / 1e12;
  };
  GemmConfig fast, split;
  fast.fast_accumulation = true;
  const RowMajorMatrix xe4{x8.get(), DType::kE4M3, m64, k64, k64, one.get()};
  const RowMajorMatrix we4{w8.get(), DType::kE4M3, n64, k64, k64, one.get()};
  const RowMajorMatrix xe5{x8.get(), DType::kE5M2, m64, k64, k64, one.get()};
  const RowMajorMatrix xbf{xb.get(), DType::kBF16, m64, k64, k64};
  const RowMajorMatrix wbf{wb.get(), DType::kBF16, n64, k64, k64};
  const RowMajorMatrix xblk{x8.get(), DType::kE4M3, m64, k64, k64, xs.get(), ScalingMode::kBlock1x128};
  const RowMajorMatrix wblk{w8.get(), DType::kE4M3, n64, k64, k64, ws.get(), ScalingMode::kBlock128x128};

  const double bf16 = tflops(xbf, wbf, {});
  const double e4_fast = tflops(xe4, we4, fast);
  const double e4_split = tflops(xe4, we4, split);
  const double e4e5_split = tflops(xe5, we4, split);
  std::printf("[fp8-bench] device: %s, GEMM %zux%zux%zu (Y = X W^T), bf16 output\n", testing::device_name().c_str(), M,
              N, K);
  std::printf("[fp8-bench] bf16 x bf16 cuBLASLt                 %7.0f TFLOP/s\n", bf16);
  std::printf("[fp8-bench] E4M3 x E4M3 fast accumulation (fprop) %7.0f TFLOP/s  %.2fx bf16 (target 1.7x)\n", e4_fast,
              e4_fast / bf16);
  std::printf("[fp8-bench] E4M3 x E4M3 split accumulation        %7.0f TFLOP/s  %.2fx bf16\n", e4_split,
              e4_split / bf16);
  std::printf("[fp8-bench] E4M3(W) x E5M2(X) split (dgrad-like)  %7.0f TFLOP/s  %.2fx bf16\n", e4e5_split,
              e4e5_split / bf16);
  try {
    const double blk = tflops(xblk, wblk, {});
    std::printf("[fp8-bench] blockwise 1x128 x 128x128            %7.0f TFLOP/s  %.2fx bf16\n", blk, blk / bf16);
  } catch (const std::exception& e) {
    ADD_FAILURE() << "block-scaled GEMM unavailable: " << e.what();
  }
  EXPECT_GE(e4_fast / bf16, 1.7) << "FP8 GEMM speed-up below the 1.7x target";
  FP8TRON_CUDA_CHECK(cudaDeviceSynchronize());
}

}  // namespace
}  // namespace fp8tron::fp8
