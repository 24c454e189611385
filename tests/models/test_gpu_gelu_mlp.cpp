// GPU tests of the GeLU GEMM epilogues (fp8/gemm.h, GemmActivation), the GeLU kernels
// (models/mlp/gelu_kernels.h) and the dense bf16 MLP (models/mlp/fused_gelu_mlp.h) against fp64 references and the unfused chain they
// replace (label gpu; skipped without a CUDA device, failing on any mismatch).
//
// Tolerances are derived, elementwise, from the roundings each path makes (first-order bounds,
// summed in absolute value, times 2 for the second-order terms and the bounds' own evaluation):
//   u = 2^-8       bf16's unit roundoff (8 significant bits): one rounding of v errs by <= u |v|;
//   n 2^-24 S      an fp32 accumulation of n products whose absolute values sum to S;
//   2^-11          cuBLASLt's fp32 evaluation of tanh in the epilogue: we allow the error bound of
//                  the hardware's tanh approximation (an exact tanh meets it too), which gives
//                  |dgelu| <= 2^-12 |x| and |dgelu'| <= 2^-11 (1/2 + |x| s(x)), s the inner
//                  derivative below.
// The unfused chain must meet the same bounds: that checks the bounds, and the fused path meeting
// them is the claim. Which GeLU the epilogue computes (tanh, not erf: they differ by up to 4.4e-4,
// below those bounds for large |x|) is pinned separately, by the mean error over many elements.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <c10/cuda/CUDAStream.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "fp8/gemm.h"
#include "fp8/grouped_gemm.h"
#include "models/mlp/fused_gelu_mlp.h"
#include "models/linear/fused_linear.h"
#include "models/mlp/gelu_kernels.h"
#include "models/gpt_model.h"
#include "parallel/parallel_state.h"

namespace fp8tron {
namespace {

#define REQUIRE_GPU() \
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device"

const double kU = std::ldexp(1.0, -8);     // bf16 unit roundoff
const double kU32 = std::ldexp(1.0, -24);  // fp32 unit roundoff
const double kTanh = std::ldexp(1.0, -11);  // relative error allowed to the epilogue's tanh
const double kA = std::sqrt(2.0 / M_PI), kC = 0.044715;

const auto kBf16 = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kBFloat16);

torch::Tensor f64(const torch::Tensor& t) { return t.detach().to(torch::kFloat64); }

// The tanh GeLU (at::gelu(x, "tanh")) of an fp64 tensor, its first and second derivatives, and the
// bounds of the epilogue's evaluation errors (header comment).
struct Gelu {
  torch::Tensor g, d1, d2, g_eval, d1_eval;
};
Gelu gelu_tanh(const torch::Tensor& x) {
  const auto s = kA * (1 + 3 * kC * x * x);  // the derivative of tanh's argument
  const auto t = torch::tanh(kA * (x + kC * x * x * x));
  const auto sech2 = 1 - t * t;
  Gelu r;
  r.g = 0.5 * x * (1 + t);
  r.d1 = 0.5 * (1 + t) + 0.5 * x * sech2 * s;
  r.d2 = sech2 * s + 0.5 * x * sech2 * (6 * kA * kC * x - 2 * t * s * s);
  r.g_eval = 0.5 * kTanh * x.abs();
  r.d1_eval = kTanh * (0.5 + x.abs() * s);
  return r;
}
torch::Tensor gelu_erf(const torch::Tensor& x) { return 0.5 * x * (1 + torch::erf(x / std::sqrt(2.0))); }

// Elements of `got` farther from `ref` than `tol`; prints the worst |error| / tol.
int64_t beyond(const torch::Tensor& got, const torch::Tensor& ref, const torch::Tensor& tol, const std::string& what) {
  const auto err = (f64(got) - ref).abs();
  const auto floor = 1e-12 * ref.abs().max().item<double>();  // exact zeros on both sides
  const double worst = (err / (tol + floor)).max().item<double>();
  const int64_t n = (err > tol + floor).sum().item<int64_t>();
  std::printf("[gelu-mlp] %-44s max |err| / tolerance %.3f, %lld of %lld beyond\n", what.c_str(), worst,
              static_cast<long long>(n), static_cast<long long>(err.numel()));
  return n;
}

CUstream_st* current_stream() { return c10::cuda::getCurrentCUDAStream().stream(); }

fp8::RowMajorMatrix row_major(const torch::Tensor& t) {
  return {t.data_ptr(), fp8::DType::kBF16, t.size(0), t.size(1), t.size(1)};
}

// ---- the epilogues -----------------------------------------------------------------------------

// gemm_nt with GELU_AUX_BIAS / GELU_AUX: G = gelu(x W^T + b) and aux = x W^T + b, bf16, against fp64.
// fc1's shape at GPT-2 124M width with an odd token count, and an output width that is a multiple
// of 8 but not of 16 (cuBLASLt's aux rule is 8). A local handle that autotunes: every candidate the
// heuristic offers runs the epilogue.
TEST(GpuGeluEpilogue, ForwardWritesTanhGeluAndItsInput) {
  REQUIRE_GPU();
  torch::manual_seed(11);
  const int64_t tokens = 1000, in = 768, ffn = 520;
  const auto x = torch::randn({tokens, in}, kBf16), w = torch::randn({ffn, in}, kBf16) * 0.05;
  const auto b = torch::randn({ffn}, kBf16) * 0.5;
  fp8::GemmHandle handle;
  for (const bool with_bias : {true, false}) {
    SCOPED_TRACE(with_bias ? "GELU_AUX_BIAS" : "GELU_AUX");
    auto g = torch::full({tokens, ffn}, NAN, kBf16), pre = torch::full({tokens, ffn}, NAN, kBf16);
    fp8::GemmConfig config;
    config.bias = with_bias ? b.data_ptr() : nullptr;
    config.activation = fp8::GemmActivation::kGeluAux;
    config.aux = pre.data_ptr();
    config.aux_ld = ffn;
    fp8::gemm_nt(handle, row_major(x), row_major(w), g.data_ptr(), fp8::DType::kBF16, ffn, config, current_stream());
    std::printf("[gelu-mlp] plan: %s -> %s\n", handle.plan_infos().back().problem.c_str(),
                handle.plan_infos().back().algo.c_str());

    auto p = f64(x).mm(f64(w).t()), sum_abs = f64(x).abs().mm(f64(w).abs().t());
    if (with_bias) {
      p = p + f64(b);
      sum_abs = sum_abs + f64(b).abs();
    }
    const auto acc_err = in * kU32 * sum_abs;  // the fp32 accumulator's error
    const std::string tag = with_bias ? " (bias)" : "";
    EXPECT_EQ(beyond(pre, p, kU * p.abs() + acc_err, "aux = x W^T + b" + tag), 0);
    const Gelu r = gelu_tanh(p);
    EXPECT_EQ(beyond(g, r.g, 2 * (kU * r.g.abs() + r.d1.abs() * acc_err + r.g_eval), "G = gelu_tanh(x W^T + b)" + tag), 0);

    // Tanh, not erf: where they differ most (x in [2.3, 3.3], erf - tanh = -3.5e-4 .. -4.4e-4),
    // the mean error to the tanh GeLU over the ~20k elements there must be well under that
    // difference (bf16 rounding errors average out: their mean is ~3e-5).
    const auto bin = (p >= 2.3).logical_and(p <= 3.3);
    const double to_tanh = (f64(g) - r.g).masked_select(bin).mean().item<double>();
    const double erf_minus_tanh = (gelu_erf(p) - r.g).masked_select(bin).mean().item<double>();
    std::printf("[gelu-mlp] %lld elements in [2.3, 3.3]: mean G - gelu_tanh %.3g, mean gelu_erf - gelu_tanh %.3g\n",
                static_cast<long long>(bin.sum().item<int64_t>()), to_tanh, erf_minus_tanh);
    EXPECT_LT(std::fabs(to_tanh), 0.5 * std::fabs(erf_minus_tanh)) << "the epilogue's GeLU is not the tanh one";
  }
}

// gemm with DGELU_BGRAD / DGELU in fc2's dgrad layout ("NN"): dPre = (dY W2) * gelu'(aux) and the
// bias gradient, the sum of dPre over tokens (bf16: cuBLASLt's type for it with a bf16 output).
TEST(GpuGeluEpilogue, BackwardWritesGeluDerivativeAndBiasGradient) {
  REQUIRE_GPU();
  torch::manual_seed(12);
  const int64_t tokens = 1000, out = 768, ffn = 520;
  const auto dy = torch::randn({tokens, out}, kBf16), w2 = torch::randn({out, ffn}, kBf16) * 0.05;
  const auto aux = torch::randn({tokens, ffn}, kBf16) * 1.5;  // a forward's GeLU inputs
  fp8::GemmHandle handle;
  for (const bool with_bias : {true, false}) {
    SCOPED_TRACE(with_bias ? "DGELU_BGRAD" : "DGELU");
    auto dpre = torch::full({tokens, ffn}, NAN, kBf16), db = torch::full({ffn}, NAN, kBf16);
    const fp8::GemmOperand a{w2.data_ptr(), fp8::DType::kBF16, ffn, out, ffn, false};
    const fp8::GemmOperand bop{dy.data_ptr(), fp8::DType::kBF16, out, tokens, out, false};
    const fp8::GemmOutput d{dpre.data_ptr(), fp8::DType::kBF16, ffn};
    fp8::GemmConfig config;
    config.activation = fp8::GemmActivation::kDGelu;
    config.aux = aux.data_ptr();
    config.aux_ld = ffn;
    if (with_bias) {
      config.bias = db.data_ptr();
      config.bias_gradient = true;
    }
    fp8::gemm(handle, a, bop, d, config, current_stream());
    std::printf("[gelu-mlp] plan: %s -> %s\n", handle.plan_infos().back().problem.c_str(),
                handle.plan_infos().back().algo.c_str());
    // Run to run bitwise (--deterministic-mode and recomputation rely on it): the bias gradient is
    // a reduction over tokens, which a kernel could do with atomics.
    const auto first_dpre = dpre.clone(), first_db = db.clone();
    fp8::gemm(handle, a, bop, d, config, current_stream());
    EXPECT_TRUE(torch::equal(dpre, first_dpre)) << "dPre differs between two identical calls";
    if (with_bias) EXPECT_TRUE(torch::equal(db, first_db)) << "the bias gradient differs between two identical calls";

    const auto prod = f64(dy).mm(f64(w2)), acc_err = out * kU32 * f64(dy).abs().mm(f64(w2).abs());
    const Gelu r = gelu_tanh(f64(aux));
    const auto ref = prod * r.d1;
    const auto unrounded_err = r.d1.abs() * acc_err + prod.abs() * r.d1_eval;  // before D's rounding
    const std::string tag = with_bias ? " (bias gradient)" : "";
    EXPECT_EQ(beyond(dpre, ref, 2 * (kU * ref.abs() + unrounded_err), "dPre = (dY W2) gelu'(aux)" + tag), 0);
    if (with_bias) {
      const auto db_ref = ref.sum(0);
      const auto db_tol = 2 * (kU * db_ref.abs() + unrounded_err.sum(0) + tokens * kU32 * ref.abs().sum(0));
      EXPECT_EQ(beyond(db, db_ref, db_tol, "bias gradient = sum over tokens of dPre"), 0);
    }
  }
}

// gemm() refuses what cuBLASLt's GeLU epilogues do not take, naming the rule.
TEST(GpuGeluEpilogue, RefusesWhatCublasLtDoesNotTake) {
  REQUIRE_GPU();
  const auto x = torch::randn({16, 64}, kBf16), w = torch::randn({36, 64}, kBf16);
  auto g = torch::empty({16, 36}, kBf16), pre = torch::empty({16, 36}, kBf16);
  const auto b32 = torch::zeros({36}, kBf16.dtype(torch::kFloat32));
  fp8::GemmConfig config;
  config.activation = fp8::GemmActivation::kGeluAux;
  config.aux = pre.data_ptr();
  config.aux_ld = 36;  // not a multiple of 8
  auto run = [&] { fp8::gemm_nt(fp8::grouped_gemm_resources().handle, row_major(x), row_major(w), g.data_ptr(),
                                fp8::DType::kBF16, 36, config, current_stream()); };
  EXPECT_THROW(run(), std::logic_error);
  config.aux_ld = 40;
  config.bias = b32.data_ptr();
  config.bias_dtype = fp8::DType::kFP32;  // cuBLASLt takes the bias in D's type
  EXPECT_THROW(run(), std::logic_error);
}

// ---- the GeLU kernels (models/mlp/gelu_kernels.h) ------------------------------------------------------

// Forward and backward on a shape that fills no block evenly (1001 rows, 776 columns): G against
// torch's tanh GeLU (both round one fp32 value: at most one bf16 step apart), the backward's G bit
// for bit the forward's, dL/dpre against torch's gelu_backward, fc1's bias gradient against the
// fp32 sum of the stored dL/dpre (written, then added), and two calls alike bit for bit.
TEST(GpuGeluKernels, ForwardBackwardAndBiasGradient) {
  REQUIRE_GPU();
  torch::manual_seed(5);
  const int64_t rows = 1001, cols = 776;
  const auto pre = torch::randn({rows, cols}, kBf16) * 3;
  const auto dg = torch::randn({rows, cols}, kBf16);
  const auto stream = c10::cuda::getCurrentCUDAStream().stream();
  auto g = torch::empty_like(pre);
  kernels::gelu_tanh_forward(pre.data_ptr(), g.data_ptr(), pre.numel(), stream);
  const auto g_torch = at::gelu(pre, "tanh");
  const auto one_step = kU * 2 * g_torch.to(torch::kFloat32).abs() + 1e-30;
  EXPECT_TRUE(((g - g_torch).to(torch::kFloat32).abs() <= one_step).all().item<bool>()) << "G differs from torch's GeLU";

  const auto f32 = kBf16.dtype(torch::kFloat32);
  auto scratch = torch::empty({kernels::gelu_backward_scratch_floats(rows, cols)}, f32);
  const auto run = [&](torch::Tensor& bias_grad, bool accumulate) {
    auto grad = dg.clone();
    auto g_again = torch::empty_like(pre);
    kernels::gelu_tanh_backward(grad.data_ptr(), pre.data_ptr(), g_again.data_ptr(), rows, cols, scratch.data_ptr<float>(),
                                bias_grad.data_ptr<float>(), accumulate, stream);
    return std::make_pair(grad, g_again);
  };
  auto bias_grad = torch::full({cols}, 123.0, f32);
  const auto [dpre, g_again] = run(bias_grad, false);
  EXPECT_TRUE(torch::equal(g_again, g)) << "the backward's G is not the forward's";
  const auto dpre_torch = at::gelu_backward(dg, pre, "tanh");
  const auto dpre_step = kU * 2 * dpre_torch.to(torch::kFloat32).abs() + 1e-6;
  EXPECT_TRUE(((dpre - dpre_torch).to(torch::kFloat32).abs() <= dpre_step).all().item<bool>())
      << "dL/dpre differs from torch's gelu_backward";
  const auto want = dpre.to(torch::kFloat64).sum(0);
  const auto sum_tol = rows * kU32 * dpre.to(torch::kFloat64).abs().sum(0) * 2 + 1e-6;
  EXPECT_TRUE(((bias_grad.to(torch::kFloat64) - want).abs() <= sum_tol).all().item<bool>()) << "bias gradient (written)";
  auto again = bias_grad.clone();
  const auto [dpre2, g2] = run(again, true);
  EXPECT_TRUE(torch::equal(dpre2, dpre) && torch::equal(g2, g_again)) << "two identical calls differ";
  EXPECT_TRUE(torch::equal(again, bias_grad + bias_grad)) << "the added bias gradient is not the written one twice";
  // Without a bias: the same dL/dpre and G, no scratch needed.
  auto grad = dg.clone();
  auto g3 = torch::empty_like(pre);
  kernels::gelu_tanh_backward(grad.data_ptr(), pre.data_ptr(), g3.data_ptr(), rows, cols, nullptr, nullptr, false, stream);
  EXPECT_TRUE(torch::equal(grad, dpre) && torch::equal(g3, g));
}

// ---- the fused MLP -------------------------------------------------------------------------------

enum class Biases { kWithMainGrads, kNone, kWithoutMainGrads };
const char* name_of(Biases b) {
  return b == Biases::kWithMainGrads ? "biases with main gradients"
         : b == Biases::kNone        ? "no biases"
                                     : "biases without main gradients";
}

struct Params {
  torch::Tensor w1, b1, w2, b2;
};

// Fresh bf16 leaves of `values`; the weights (and with kWithMainGrads the biases) get fp32 main
// gradients holding `initial` (an earlier accumulation).
Params leaves(const Params& values, const Params& initial, Biases biases) {
  auto leaf = [](const torch::Tensor& v, const torch::Tensor& grad) {
    auto p = v.clone().requires_grad_(true);
    if (grad.defined()) p.mutable_grad() = grad.clone();
    return p;
  };
  Params p;
  p.w1 = leaf(values.w1, initial.w1);
  p.w2 = leaf(values.w2, initial.w2);
  if (biases != Biases::kNone) {
    const bool main = biases == Biases::kWithMainGrads;
    p.b1 = leaf(values.b1, main ? initial.b1 : torch::Tensor());
    p.b2 = leaf(values.b2, main ? initial.b2 : torch::Tensor());
  }
  return p;
}

torch::Tensor unfused_chain(const torch::Tensor& x, const Params& p) {
  const auto main_grads = make_main_grads();
  const auto h = linear_with_grad_accumulation_fusion(x, p.w1, p.b1, main_grads);
  return linear_with_grad_accumulation_fusion(at::gelu(h, "tanh"), p.w2, p.b2, main_grads);
}
torch::Tensor fused_chain(const torch::Tensor& x, const Params& p) {
  const GeluMlpParams params{p.w1, p.b1, p.w2, p.b2, make_main_grads()};
  EXPECT_EQ(fused_gelu_mlp_blocker(x, params), "");
  return fused_gelu_mlp(x, params);
}

// One micro-batch's fp64 values and tolerances (header comment), from the bf16 inputs.
struct Reference {
  torch::Tensor y, dx, dw1, db1, dw2, db2;
  torch::Tensor y_tol, dx_tol, dw1_tol, db1_tol, dw2_tol, db2_tol;
};
Reference reference(const torch::Tensor& x_bf16, const Params& v, bool biases, const torch::Tensor& dy_bf16) {
  const auto x = f64(x_bf16).reshape({-1, v.w1.size(1)}), dy = f64(dy_bf16).reshape({-1, v.w2.size(0)});
  const auto w1 = f64(v.w1), w2 = f64(v.w2);
  const int64_t tokens = x.size(0), in = w1.size(1), ffn = w1.size(0), out = w2.size(0);
  auto pre = x.mm(w1.t()), pre_abs = x.abs().mm(w1.abs().t());
  if (biases) {
    pre = pre + f64(v.b1);
    pre_abs = pre_abs + f64(v.b1).abs();
  }
  const Gelu r = gelu_tanh(pre);
  const auto pre_err = kU * pre.abs() + in * kU32 * pre_abs;      // fc1's output (the unfused chain rounds it)
  const auto g_err = kU * r.g.abs() + r.d1.abs() * pre_err + r.g_eval;
  Reference ref;
  ref.y = r.g.mm(w2.t());
  auto y_abs = r.g.abs().mm(w2.abs().t());
  if (biases) {
    ref.y = ref.y + f64(v.b2);
    y_abs = y_abs + f64(v.b2).abs();
  }
  ref.y_tol = 2 * (kU * ref.y.abs() + g_err.mm(w2.abs().t()) + ffn * kU32 * y_abs);
  const auto dg = dy.mm(w2);
  const auto dg_err = kU * dg.abs() + out * kU32 * dy.abs().mm(w2.abs());
  const auto dpre = dg * r.d1;
  const auto dpre_err = kU * dpre.abs() + r.d1.abs() * dg_err + dg.abs() * (r.d2.abs() * pre_err + r.d1_eval);
  ref.dx = dpre.mm(w1);
  ref.dx_tol = 2 * (kU * ref.dx.abs() + dpre_err.mm(w1.abs()) + ffn * kU32 * dpre.abs().mm(w1.abs()));
  ref.dw1 = dpre.t().mm(x);
  ref.dw1_tol = 2 * (dpre_err.t().mm(x.abs()) + tokens * kU32 * dpre.abs().t().mm(x.abs()));
  ref.db1 = dpre.sum(0);
  ref.db1_tol = 2 * (kU * ref.db1.abs() + dpre_err.sum(0) + tokens * kU32 * dpre.abs().sum(0));
  ref.dw2 = dy.t().mm(r.g);
  ref.dw2_tol = 2 * (dy.abs().t().mm(g_err) + tokens * kU32 * dy.abs().t().mm(r.g.abs()));
  ref.db2 = dy.sum(0);
  ref.db2_tol = 2 * tokens * kU32 * dy.abs().sum(0);
  return ref;
}

// Two micro-batches (the main gradients accumulate) through `chain`: outputs and input gradients
// per micro-batch, parameter gradients at the end, each within its tolerance of the fp64 values.
template <class Chain>
void check_chain(Chain chain, const char* path, Biases biases, const Params& values, const Params& initial,
                 const std::vector<torch::Tensor>& xs, const std::vector<torch::Tensor>& dys) {
  const Params p = leaves(values, initial, biases);
  const auto w1_main = p.w1.grad().data_ptr(), w2_main = p.w2.grad().data_ptr();
  const bool with_biases = biases != Biases::kNone;
  Params want{initial.w1.to(torch::kFloat64), {}, initial.w2.to(torch::kFloat64), {}}, tol;
  tol.w1 = torch::zeros_like(want.w1);
  tol.w2 = torch::zeros_like(want.w2);
  const bool bias_main = biases == Biases::kWithMainGrads;
  if (with_biases) {
    want.b1 = bias_main ? initial.b1.to(torch::kFloat64) : torch::zeros({values.b1.size(0)}, want.w1.options());
    want.b2 = bias_main ? initial.b2.to(torch::kFloat64) : torch::zeros({values.b2.size(0)}, want.w1.options());
    tol.b1 = torch::zeros_like(want.b1);
    tol.b2 = torch::zeros_like(want.b2);
  }
  const std::string tag = std::string(path) + ", " + name_of(biases) + ": ";
  for (size_t i = 0; i < xs.size(); ++i) {
    auto x = xs[i].clone().requires_grad_(true);
    auto y = chain(x, p);
    y.backward(dys[i]);
    const Reference ref = reference(xs[i], values, with_biases, dys[i]);
    const std::string mb = " (micro-batch " + std::to_string(i) + ")";
    EXPECT_EQ(beyond(y.reshape({-1, y.size(-1)}), ref.y, ref.y_tol, tag + "Y" + mb), 0);
    EXPECT_EQ(beyond(x.grad().reshape({-1, x.size(-1)}), ref.dx, ref.dx_tol, tag + "dX" + mb), 0);
    want.w1 += ref.dw1;
    tol.w1 += ref.dw1_tol;
    want.w2 += ref.dw2;
    tol.w2 += ref.dw2_tol;
    if (with_biases) {
      want.b1 += ref.db1;
      tol.b1 += ref.db1_tol;
      want.b2 += ref.db2;
      tol.b2 += ref.db2_tol;
      if (!bias_main) {  // returned to autograd in bf16: one more rounding each
        tol.b1 += 2 * kU * ref.db1.abs();
        tol.b2 += 2 * kU * ref.db2.abs();
      }
    }
  }
  // Accumulation: fp32 main gradients round once per addition, autograd's bf16 gradients once per
  // addition after the first micro-batch's.
  const double sum_u = bias_main ? xs.size() * kU32 : (xs.size() - 1) * kU;
  EXPECT_EQ(p.w1.grad().data_ptr(), w1_main) << tag << "fc1's main gradient was replaced, not accumulated into";
  EXPECT_EQ(p.w2.grad().data_ptr(), w2_main) << tag << "fc2's main gradient was replaced, not accumulated into";
  EXPECT_EQ(beyond(p.w1.grad(), want.w1, tol.w1 + 2 * xs.size() * kU32 * want.w1.abs(), tag + "fc1 weight gradient"), 0);
  EXPECT_EQ(beyond(p.w2.grad(), want.w2, tol.w2 + 2 * xs.size() * kU32 * want.w2.abs(), tag + "fc2 weight gradient"), 0);
  if (with_biases) {
    ASSERT_TRUE(p.b1.grad().defined() && p.b2.grad().defined());
    EXPECT_EQ(p.b1.grad().scalar_type(), bias_main ? torch::kFloat32 : torch::kBFloat16);
    EXPECT_EQ(beyond(p.b1.grad(), want.b1, tol.b1 + 2 * sum_u * want.b1.abs(), tag + "fc1 bias gradient"), 0);
    EXPECT_EQ(beyond(p.b2.grad(), want.b2, tol.b2 + 2 * sum_u * want.b2.abs(), tag + "fc2 bias gradient"), 0);
  }
}

// The fused MLP against the fp64 MLP, next to the unfused chain (linear_with_grad_accumulation_fusion,
// at::gelu tanh, linear) held to the same bounds: GPT-2 124M's hidden 768 / ffn 3072, 1000 tokens
// ([125, 8] sequence x batch), two micro-batches.
TEST(GpuFusedGeluMlp, MatchesTheFp64MlpLikeTheUnfusedChain) {
  REQUIRE_GPU();
  torch::manual_seed(13);
  const int64_t hidden = 768, ffn = 3072;
  const Params values{torch::randn({ffn, hidden}, kBf16) * 0.02, torch::randn({ffn}, kBf16) * 0.1,
                      torch::randn({hidden, ffn}, kBf16) * 0.02, torch::randn({hidden}, kBf16) * 0.1};
  const auto f32 = kBf16.dtype(torch::kFloat32);
  const Params initial{torch::randn({ffn, hidden}, f32) * 0.01, torch::randn({ffn}, f32) * 0.01,
                       torch::randn({hidden, ffn}, f32) * 0.01, torch::randn({hidden}, f32) * 0.01};
  const std::vector<torch::Tensor> xs = {torch::randn({125, 8, hidden}, kBf16), torch::randn({125, 8, hidden}, kBf16)};
  const std::vector<torch::Tensor> dys = {torch::randn({125, 8, hidden}, kBf16) * 0.1,
                                          torch::randn({125, 8, hidden}, kBf16) * 0.1};
  for (const Biases biases : {Biases::kWithMainGrads, Biases::kNone, Biases::kWithoutMainGrads}) {
    check_chain(fused_chain, "fused", biases, values, initial, xs, dys);
    check_chain(unfused_chain, "unfused", biases, values, initial, xs, dys);
  }
}

// A dense Mlp module (fc1 with its LayerNorm, TP = 1, bf16 with fp32 main gradients): the fused
// path by default; --no-bias-gelu-fusion and --no-gradient-accumulation-fusion each give today's
// path, bitwise the unfused chain of ops.
ModelConfig mlp_config(bool bias_gelu_fusion) {
  ModelConfig m;
  m.num_layers = 12;
  m.hidden_size = 768;
  m.ffn_hidden_size = 3072;
  m.bias_gelu_fusion = bias_gelu_fusion;
  return m;
}

Mlp gpu_mlp(bool bias_gelu_fusion, bool gradient_accumulation_fusion = true) {
  const TensorParallelContext tp{make_self_communicator("tp", 0), 0, 1, false};
  Mlp mlp(mlp_config(bias_gelu_fusion), "decoder.layers.0.mlp",
          ModuleFactory(1234, tp, nullptr, {}, make_main_grads(gradient_accumulation_fusion)));
  mlp->to(torch::kCUDA, torch::kBFloat16);
  torch::NoGradGuard no_grad;
  torch::manual_seed(21);  // the same parameters for every module built here
  for (auto& p : mlp->parameters()) {
    p.add_(torch::randn_like(p) * 0.02);  // biases off zero
    p.mutable_grad() = torch::zeros(p.sizes(), p.options().dtype(torch::kFloat32));
  }
  return mlp;
}

std::string grad_fn_of(const torch::Tensor& y) { return y.grad_fn() ? y.grad_fn()->name() : "(none)"; }

TEST(GpuFusedGeluMlp, ModuleDispatchAndItsSwitches) {
  REQUIRE_GPU();
  torch::manual_seed(14);
  const auto x = torch::randn({125, 8, 768}, kBf16), dy = torch::randn({125, 8, 768}, kBf16);
  auto fused = gpu_mlp(true);
  auto y_fused = fused->forward(x.clone().requires_grad_(true));
  EXPECT_NE(grad_fn_of(y_fused).find("FusedGeluMlp"), std::string::npos) << grad_fn_of(y_fused);

  // Off: bitwise the chain of ops today's path runs.
  auto plain = gpu_mlp(false);
  auto xp = x.clone().requires_grad_(true);
  auto y_plain = plain->forward(xp);
  EXPECT_EQ(grad_fn_of(y_plain).find("FusedGeluMlp"), std::string::npos) << grad_fn_of(y_plain);
  auto& fc1 = *plain->linear_fc1;
  auto& fc2 = *plain->linear_fc2;
  auto xc = x.clone().requires_grad_(true);
  const auto normed =
      apply_norm(xc, fc1.norm_options, fc1.layer_norm_weight, fc1.layer_norm_bias, plain->linear_fc1->main_grads);  // the modules' norm
  const auto h = linear_with_grad_accumulation_fusion(normed, fc1.weight, fc1.bias, fc1.main_grads);
  const auto y_chain = linear_with_grad_accumulation_fusion(at::gelu(h, "tanh"), fc2.weight, fc2.bias, fc2.main_grads);
  EXPECT_TRUE(torch::equal(y_plain, y_chain)) << "--no-bias-gelu-fusion is not today's path";
  y_plain.backward(dy);
  const auto dx_plain = xp.grad().clone();
  y_chain.backward(dy);
  EXPECT_TRUE(torch::equal(dx_plain, xc.grad())) << "input gradient of the unfused module";

  // Fused and unfused agree within bf16 steps (the fp64 comparison above is the precise check).
  const double scale = y_plain.abs().max().item<double>();
  EXPECT_LT((y_fused - y_plain).abs().max().item<double>(), 0.05 * scale);

  // --no-gradient-accumulation-fusion: the model built with fusion off plans no fused MLP.
  auto no_fusion = gpu_mlp(true, /*gradient_accumulation_fusion=*/false);
  const torch::Tensor y_no_fusion = no_fusion->forward(x);
  EXPECT_EQ(grad_fn_of(y_no_fusion).find("FusedGeluMlp"), std::string::npos)
      << "--no-gradient-accumulation-fusion kept the fused MLP: " << grad_fn_of(y_no_fusion);
}

}  // namespace
}  // namespace fp8tron
