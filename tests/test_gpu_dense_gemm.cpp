// GPU tests of the bf16 linears' backward through our cuBLASLt GEMMs and the column-sum bias
// gradient (models/dense_gemm.h, models/column_sums_kernels.h; label gpu, skipped without a CUDA
// device, failing on any mismatch):
//   - the column sums against fp64 sums of the same bf16 values (fp32 accumulation over n rows errs
//     by at most n 2^-24 of the absolute sum; we allow 4x that), bitwise repeatable, written and
//     accumulated;
//   - dX and the fp32 weight gradient against fp64 products of the same operands, as close as
//     ATen's own GEMMs are (dX: one bf16 rounding, 2^-8 relative, plus the fp32 accumulation);
//   - training with the path on against the path off (tiny GPT, bf16, the GeLU MLP with biases and
//     the SwiGLU MLP without): the same losses and weights up to the different GEMMs' roundings,
//     and the path actually ran.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <c10/cuda/CUDAStream.h>

#include <cmath>
#include <string>
#include <vector>

#include "models/column_sums_kernels.h"
#include "models/dense_gemm.h"
#include "test_helpers.h"
#include "trainer/cli/config_builder.h"
#include "trainer/trainer.h"

namespace fp8tron {
namespace {
using testing::parse;
using testing::tiny_args;

#define REQUIRE_GPU() \
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device"

struct SwitchOn {
  SwitchOn() { set_dense_gemms_through_cublaslt(true); }
  ~SwitchOn() { set_dense_gemms_through_cublaslt(false); }
};

torch::TensorOptions bf16() { return torch::TensorOptions().device(torch::kCUDA).dtype(torch::kBFloat16); }

TEST(GpuDenseGemm, ColumnSumsAreTheSumsOfEachColumn) {
  REQUIRE_GPU();
  const auto stream = c10::cuda::getCurrentCUDAStream().stream();
  for (const auto& [rows, cols] : std::vector<std::pair<int64_t, int64_t>>{{1, 8}, {7, 24}, {300, 264}, {8192, 6144},
                                                                           {16384, 768}, {5, 8200}}) {
    torch::manual_seed(rows + cols);
    const auto x = torch::randn({rows, cols}, bf16());
    const auto x64 = x.to(torch::kFloat64);
    // Each sum is three fp32 chains: a thread's rows of its chunk (a row in every 8), the 8 lanes,
    // the chunks; each addition errs by at most 2^-24 of the running sum's bound.
    const int64_t floats = kernels::column_sums_scratch_floats(rows, cols), chunks = floats / cols;
    const int64_t depth = ((rows + chunks - 1) / chunks + 7) / 8 + 8 + chunks;
    const auto expect = x64.sum(0), bound = 2.0 * double(depth) * std::ldexp(1.0, -24) * x64.abs().sum(0) + 1e-30;
    auto scratch = torch::empty({std::max<int64_t>(1, floats)}, bf16().dtype(torch::kFloat32));
    auto out = torch::full({cols}, 7.0f, bf16().dtype(torch::kFloat32));
    kernels::column_sums_bf16(x.data_ptr(), rows, cols, scratch.data_ptr<float>(), out.data_ptr<float>(), false, stream);
    const auto err = (out.to(torch::kFloat64) - expect).abs();
    EXPECT_TRUE((err <= bound).all().item<bool>()) << rows << " x " << cols << ": worst " << (err / bound).max().item<double>()
                                                   << " of the bound";
    auto again = torch::empty_like(out);
    kernels::column_sums_bf16(x.data_ptr(), rows, cols, scratch.data_ptr<float>(), again.data_ptr<float>(), false, stream);
    EXPECT_TRUE(torch::equal(out, again)) << "not repeatable";
    auto accumulated = torch::ones({cols}, bf16().dtype(torch::kFloat32));
    kernels::column_sums_bf16(x.data_ptr(), rows, cols, scratch.data_ptr<float>(), accumulated.data_ptr<float>(), true,
                              stream);
    EXPECT_TRUE(torch::equal(accumulated, out + 1.0f)) << "accumulate adds the sums to the output once";
  }
}

// ||got - exact|| / ||exact|| for the GEMM paths and ATen's on the same operands.
double relative(const torch::Tensor& got, const torch::Tensor& exact) {
  return ((got.to(torch::kFloat64) - exact).norm() / exact.norm()).item<double>();
}

TEST(GpuDenseGemm, GradientsMatchTheExactProductsLikeAtens) {
  REQUIRE_GPU();
  const SwitchOn on;
  const uint64_t calls_before = dense_gemm_calls();
  // [tokens, in] -> [tokens, out] linears of the benchmark models, and small odd ones.
  for (const auto& [tokens, in, out] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{
           {16384, 768, 2304}, {8192, 8192, 2048}, {8192, 2048, 11264}, {40, 24, 56}}) {
    torch::manual_seed(tokens + in + out);
    const auto x = torch::randn({tokens, in}, bf16()), w = torch::randn({out, in}, bf16()) * 0.02;
    const auto dy = torch::randn({tokens, out}, bf16());
    const auto x64 = x.to(torch::kFloat64), w64 = w.to(torch::kFloat64), dy64 = dy.to(torch::kFloat64);
    const auto dx_exact = dy64.mm(w64), dw_exact = dy64.t().mm(x64);
    const double aten_dx = relative(at::mm(dy, w), dx_exact);
    const double ours_dx = relative(linear_dgrad(dy, w), dx_exact);
    EXPECT_LT(ours_dx, std::max(2.0 * aten_dx, 4e-3)) << tokens << " x " << in << " -> " << out;
    auto main_grad = torch::full({out, in}, 3.0f, bf16().dtype(torch::kFloat32));
    dense_wgrad(dy, x, main_grad, /*overwrite=*/true);
    EXPECT_LT(relative(main_grad, dw_exact), 1e-5) << "written";
    dense_wgrad(dy, x, main_grad, /*overwrite=*/false);
    EXPECT_LT(relative(main_grad, 2.0 * dw_exact), 1e-5) << "accumulated";
    auto bias_grad = torch::full({out}, 3.0f, bf16().dtype(torch::kFloat32));
    dense_bias_grad(dy, bias_grad, /*overwrite=*/true);
    EXPECT_LT(relative(bias_grad, dy64.sum(0)), 1e-5) << "bias gradient written";
    dense_bias_grad(dy, bias_grad, /*overwrite=*/false);
    EXPECT_LT(relative(bias_grad, 2.0 * dy64.sum(0)), 1e-5) << "bias gradient accumulated";
  }
  EXPECT_EQ(dense_gemm_calls() - calls_before, 4u * 5u) << "every call took the path";
}

// Where the path does not apply the functions run ATen's calls: operands that are not whole
// 16-byte rows, a view whose data starts off a 16-byte boundary, fp16, and no tokens.
TEST(GpuDenseGemm, OperandsThePathDoesNotTakeRunAtensCalls) {
  REQUIRE_GPU();
  const SwitchOn on;
  torch::manual_seed(3);
  const auto w = torch::randn({64, 48}, bf16()), dy = torch::randn({32, 64}, bf16());
  const uint64_t before = dense_gemm_calls();
  const auto offset = torch::randn({33, 64}, bf16()).narrow(0, 0, 33).flatten().narrow(0, 1, 32 * 64).view({32, 64});
  EXPECT_TRUE(torch::equal(linear_dgrad(offset, w), at::mm(offset, w))) << "misaligned view";
  const auto w_odd = torch::randn({64, 44}, bf16());
  EXPECT_TRUE(torch::equal(linear_dgrad(dy, w_odd), at::mm(dy, w_odd))) << "rows of 44 values";
  const auto dy16 = dy.to(torch::kFloat16), w16 = w.to(torch::kFloat16);
  EXPECT_TRUE(torch::equal(linear_dgrad(dy16, w16), at::mm(dy16, w16))) << "fp16";
  EXPECT_EQ(linear_dgrad(torch::empty({0, 64}, bf16()), w).sizes(), (std::vector<int64_t>{0, 48}));
  EXPECT_FALSE(dense_param_grads_apply(torch::empty({0, 64}, bf16()), torch::empty({0, 48}, bf16()))) << "no tokens";
  EXPECT_FALSE(dense_param_grads_apply(offset, torch::randn({32, 48}, bf16()))) << "misaligned view";
  EXPECT_EQ(dense_gemm_calls(), before) << "the path ran where it does not apply";
}

TEST(GpuDenseGemm, TrainingWithThePathMatchesTrainingWithoutIt) {
  REQUIRE_GPU();
  for (const std::vector<std::string>& flags :
       {std::vector<std::string>{}, {"--disable-bias-linear", "--swiglu", "--untie-embeddings-and-output-weights"}}) {
    std::vector<std::string> argv = tiny_args({"--hidden-size", "128", "--num-attention-heads", "4", "--seq-length", "128",
                                               "--micro-batch-size", "8", "--global-batch-size", "16", "--vocab-size",
                                               "512", "--lr", "3e-3", "--attention-dropout", "0", "--hidden-dropout", "0",
                                               "--log-interval", "1000", "--eval-iters", "0", "--train-iters", "4",
                                               "--bf16", "--device", "cuda"});
    argv.insert(argv.end(), flags.begin(), flags.end());
    const Config c = build_config(parse(argv), LaunchEnv{}, /*gpu_available=*/true);
    const TrainOptions weights{.collect_final_weights = true, .collect_initial_weights = true};
    const TrainResult aten = train(c, weights);
    TrainResult ours;
    uint64_t calls = 0;
    {
      const SwitchOn on;
      const uint64_t before = dense_gemm_calls();
      ours = train(c, weights);
      calls = dense_gemm_calls() - before;
    }
    EXPECT_GT(calls, 0u) << "the path did not run";
    ASSERT_EQ(ours.losses.size(), aten.losses.size());
    for (size_t i = 0; i < aten.losses.size(); ++i)
      EXPECT_NEAR(ours.losses[i], aten.losses[i], 1e-2 * aten.losses[i]) << "iteration " << i + 1;
    for (const auto& [name, w] : aten.final_weights) {
      // Each tensor against how far training moved it: a missing gradient, or one of another
      // parameter, moves it by about its whole update; bf16 GEMMs that round differently by a few
      // percent of it. (Adam and the global clip hardly see a gradient's scale: the test above
      // checks the values themselves.)
      const double moved = (w - aten.initial_weights.at(name)).norm().item<double>();
      const double ratio = (ours.final_weights.at(name) - w).norm().item<double>() / std::max(moved, 1e-30);
      EXPECT_LT(ratio, 0.1) << name;
    }
  }
}

}  // namespace
}  // namespace fp8tron
