// Grouped GEMMs (fp8/grouped_gemm.h) and bucketed plans (gemm.h): per-expert FP8 and bf16 GEMMs
// with token counts in and across buckets, issued on the side streams, against the same calls one
// after the other on one stream (bit for bit: the same plans, hence the same kernels) and against a
// double-precision reference of the (dequantized) operands (layouts: a wrong exact-size layout
// gives O(1) errors). One plan per bucket, never autotuned, none added by counts of a bucket seen.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "fp8/format_codec.h"
#include "fp8/formats.h"
#include "fp8/gemm.h"
#include "fp8/grouped_gemm.h"
#include "fp8/quantize_reference.h"
#include "gpu_test_util.h"

namespace fp8tron::fp8 {
namespace {

using testing::DeviceBuffer;
using testing::HostQuantized;
using testing::random_bf16;

// One expert's operands: X [m, K] and W [N, K], as FP8 (E4M3 codes and a scale) or bf16, with
// their values as doubles for the reference.
struct Expert {
  int64_t m = 0;
  std::vector<uint8_t> x8, w8;
  std::vector<uint16_t> x16, w16;
  float x_sinv = 1, w_sinv = 1;
  std::vector<double> xv, wv;
};

Expert make_expert(int64_t m, int64_t k, int64_t n, uint32_t seed, bool fp8) {
  Expert e;
  e.m = m;
  const auto x = random_bf16(size_t(m * k), seed, 1.0f), w = random_bf16(size_t(n * k), seed + 1000, 0.05f);
  if (!fp8) {
    e.x16 = x;
    e.w16 = w;
    for (auto v : x) e.xv.push_back(codec::bf16_to_float(v));
    for (auto v : w) e.wv.push_back(codec::bf16_to_float(v));
    return e;
  }
  auto quantize = [&](const std::vector<uint16_t>& v, size_t rows, float scale, std::vector<uint8_t>& codes, float& sinv,
                      std::vector<double>& values) {
    HostQuantized q(ScalingMode::kTensor, Format::kE4M3, rows, size_t(k), true, false);
    q.scale = scale;
    reference::quantize_tensor_delayed(v.data(), q.view);
    codes = q.data;
    sinv = q.sinv(0);
    for (auto c : codes) values.push_back(double(decode(Format::kE4M3, c)) * sinv);
  };
  quantize(x, size_t(m), 64.0f, e.x8, e.x_sinv, e.xv);
  quantize(w, size_t(n), 2048.0f, e.w8, e.w_sinv, e.wv);
  return e;
}

// Y [m, N] = X W^T in double.
std::vector<double> reference_product(const Expert& e, int64_t k, int64_t n) {
  std::vector<double> y(size_t(e.m * n), 0.0);
  for (int64_t r = 0; r < e.m; ++r)
    for (int64_t c = 0; c < n; ++c) {
      double s = 0;
      for (int64_t i = 0; i < k; ++i) s += e.xv[size_t(r * k + i)] * e.wv[size_t(c * k + i)];
      y[size_t(r * n + c)] = s;
    }
  return y;
}

double relative_error(const std::vector<uint16_t>& got, const std::vector<double>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double d = double(codec::bf16_to_float(got[i])) - want[i];
    num += d * d;
    den += want[i] * want[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

struct DeviceExpert {
  DeviceBuffer<uint8_t> x8, w8;
  DeviceBuffer<uint16_t> x16, w16, y, y_sequential;
  DeviceBuffer<float> sx, sw;
  explicit DeviceExpert(const Expert& e, int64_t n)
      : x8(e.x8), w8(e.w8), x16(e.x16), w16(e.w16), y(size_t(e.m * n), 0), y_sequential(size_t(e.m * n), 0),
        sx(std::vector<float>{e.x_sinv}), sw(std::vector<float>{e.w_sinv}) {}
};

// fprop-style products (the token count is gemm_nt's M, bucket kN) for FP8 and bf16, in two
// rounds of counts sharing their buckets.
TEST(GpuGroupedGemm, MatchesSequentialCallsAndTheReferenceWithOnePlanPerBucket) {
  FP8_REQUIRE_GPU();
  const int64_t k = 256, n = 384;
  GemmHandleOptions options;
  options.algo_selection = AlgoSelection::kAutotune;  // bucketed plans ignore it
  for (const bool fp8 : {true, false}) {
    if (fp8 && testing::compute_capability_major() < 9) continue;
    SCOPED_TRACE(fp8 ? "fp8" : "bf16");
    GemmHandle handle(options);
    SideStreams streams(kGroupedGemmStreams);
    size_t plans_after_first_round = 0;
    const std::vector<std::vector<int64_t>> rounds = {{16, 48, 130, 1000, 2000, 7}, {20, 33, 140, 1010, 1900, 1}};
    for (size_t round = 0; round < rounds.size(); ++round) {
      SCOPED_TRACE("round " + std::to_string(round));
      std::vector<Expert> experts;
      std::vector<std::unique_ptr<DeviceExpert>> dev;
      for (size_t i = 0; i < rounds[round].size(); ++i) {
        experts.push_back(make_expert(rounds[round][i], k, n, uint32_t(100 * round + i), fp8));
        dev.push_back(std::make_unique<DeviceExpert>(experts.back(), n));
      }
      auto problems = [&](bool sequential) {
        std::vector<GroupedGemm> gemms;
        for (size_t i = 0; i < experts.size(); ++i) {
          const DeviceExpert& d = *dev[i];
          const int64_t m = experts[i].m;
          const RowMajorMatrix x = fp8 ? RowMajorMatrix{d.x8.get(), DType::kE4M3, m, k, k, d.sx.get()}
                                       : RowMajorMatrix{d.x16.get(), DType::kBF16, m, k, k};
          const RowMajorMatrix w = fp8 ? RowMajorMatrix{d.w8.get(), DType::kE4M3, n, k, k, d.sw.get()}
                                       : RowMajorMatrix{d.w16.get(), DType::kBF16, n, k, k};
          GroupedGemm g;
          g.problem = nt_problem(x, w, sequential ? d.y_sequential.get() : d.y.get(), DType::kBF16, n);
          g.config.bucket = GemmBucket::kN;
          g.config.fast_accumulation = fp8;
          gemms.push_back(g);
        }
        return gemms;
      };
      grouped_gemm(handle, streams, problems(false), nullptr);
      for (const GroupedGemm& g : problems(true)) gemm(handle, g.problem.a, g.problem.b, g.problem.d, g.config, nullptr);
      FP8TRON_CUDA_CHECK(cudaDeviceSynchronize());
      for (size_t i = 0; i < experts.size(); ++i) {
        SCOPED_TRACE("expert with " + std::to_string(experts[i].m) + " tokens");
        const auto y = dev[i]->y.download();
        EXPECT_EQ(y, dev[i]->y_sequential.download()) << "grouped and sequential calls differ";
        const double err = relative_error(y, reference_product(experts[i], k, n));
        EXPECT_LT(err, 1e-2);
      }
      if (round == 0) plans_after_first_round = handle.cached_plans();
    }
    int64_t misses = 0;
    size_t bucketed = 0;
    for (const GemmPlanInfo& info : handle.plan_infos()) {
      EXPECT_TRUE(info.bucketed || info.note.find("fallback") != std::string::npos) << info.problem;
      EXPECT_FALSE(info.autotuned) << info.problem;
      misses += info.bucket_misses;
      bucketed += info.bucketed ? 1 : 0;
    }
    // Buckets of the first round: 128 (16, 48, 7), 160 (130), 1024 (1000), 2048 (2000); the second
    // round's counts fall into the same ones (1900 -> 2048, 140 -> 160, 1010 -> 1024, ...). Exact
    // fallback plans exist only where cuBLASLt refused a bucket's algorithm (misses).
    EXPECT_EQ(bucketed, 4u);
    if (misses == 0) EXPECT_EQ(handle.cached_plans(), plans_after_first_round);
    std::printf("[fp8-bench] grouped %s GEMMs: %zu plans for 12 token counts, %lld bucket misses\n", fp8 ? "FP8" : "bf16",
                handle.cached_plans(), (long long)misses);
  }
}

// The wgrad form: the token count is the reduction (bucket kK), operands are the transposed copies
// whose leading dimension is the token count, output fp32 accumulated (beta = 1).
TEST(GpuGroupedGemm, WgradOverTokensAccumulatesIntoFp32) {
  FP8_REQUIRE_GPU();
  if (testing::compute_capability_major() < 9) GTEST_SKIP() << "FP8 GEMMs need sm_90";
  const int64_t n = 256, kout = 192;  // dW [n, kout] = dY^T [n, t] * (X^T [kout, t])^T
  GemmHandle handle;
  SideStreams streams(kGroupedGemmStreams);
  const std::vector<int64_t> tokens = {16, 48, 272, 1008, 2032};
  std::vector<GroupedGemm> gemms;
  std::vector<Expert> a, b;
  std::vector<std::unique_ptr<DeviceExpert>> da, db;
  std::vector<std::unique_ptr<DeviceBuffer<float>>> out;
  for (size_t i = 0; i < tokens.size(); ++i) {
    // "Rows" n (resp. kout) of a [rows, t] matrix: make_expert's X with m = rows and k = t.
    a.push_back(make_expert(n, tokens[i], 1, uint32_t(7 + i), true));
    b.push_back(make_expert(kout, tokens[i], 1, uint32_t(70 + i), true));
    da.push_back(std::make_unique<DeviceExpert>(a.back(), 1));
    db.push_back(std::make_unique<DeviceExpert>(b.back(), 1));
    out.push_back(std::make_unique<DeviceBuffer<float>>(std::vector<float>(size_t(n * kout), 0.5f)));
    const RowMajorMatrix x{da.back()->x8.get(), DType::kE4M3, n, tokens[i], tokens[i], da.back()->sx.get()};
    const RowMajorMatrix w{db.back()->x8.get(), DType::kE4M3, kout, tokens[i], tokens[i], db.back()->sx.get()};
    GroupedGemm g;
    g.problem = nt_problem(x, w, out.back()->get(), DType::kFP32, kout);
    g.config.bucket = GemmBucket::kK;
    g.config.accumulate = true;
    gemms.push_back(g);
  }
  grouped_gemm(handle, streams, gemms, nullptr);
  FP8TRON_CUDA_CHECK(cudaDeviceSynchronize());
  for (size_t i = 0; i < tokens.size(); ++i) {
    SCOPED_TRACE("tokens " + std::to_string(tokens[i]));
    const auto got = out[i]->download();
    double num = 0, den = 0;
    for (int64_t r = 0; r < n; ++r)
      for (int64_t c = 0; c < kout; ++c) {
        double s = 0.5;
        for (int64_t t = 0; t < tokens[i]; ++t) s += a[i].xv[size_t(r * tokens[i] + t)] * b[i].xv[size_t(c * tokens[i] + t)];
        const double d = double(got[size_t(r * kout + c)]) - s;
        num += d * d;
        den += s * s;
      }
    EXPECT_LT(std::sqrt(num / den), 1e-3);
  }
  for (const GemmPlanInfo& info : handle.plan_infos()) EXPECT_FALSE(info.autotuned) << info.problem;
}

}  // namespace
}  // namespace fp8tron::fp8
