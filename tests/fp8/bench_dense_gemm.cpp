// The bf16 GEMMs of the dense reference models (GPT-2 124M, GPT 1.3B, LLaMA-style 1.1B) on one
// GPU, each GEMM of a linear layer timed every way it can run:
//   fprop  Y = X W^T (+ b)      ATen at::linear (what the bf16 modules call: cuBLASLt with the bias
//                               in its epilogue), ATen at::mm without the bias (what a compiled
//                               PyTorch model runs: the bias goes into its next fused kernel), and
//                               our cuBLASLt gemm() with the heuristic's first choice and autotuned
//   dgrad  dX = dY W            at::mm, ours heuristic, ours autotuned
//   wgrad  dW (+)= dY^T X       into the fp32 main gradient: at::addmm_out(out_dtype fp32) (the
//                               modules without a bias), ours heuristic with BGRADB (the modules
//                               with a bias), ours autotuned with and without BGRADB; and at::mm
//                               with a bf16 result (a compiled PyTorch model's wgrad)
// Milliseconds per call (CUDA events around back-to-back calls), then each variant's sum over one
// training step (every layer's linears; the output layer's logits GEMMs once). The autotuned
// plans' candidates are printed with FP8TRON_BENCH_VERBOSE=1.
//
// Build and run (on a machine with a GPU):
//   ./scripts/build.sh fp8tron_bench_dense_gemm && build/tests/fp8/fp8tron_bench_dense_gemm [iters]
#include <ATen/cuda/CUDAContext.h>
#include <torch/torch.h>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "fp8/call_timer.h"
#include "fp8/gemm.h"

namespace fp8tron::fp8 {
namespace {

int g_iters = 30;

CUstream_st* current() { return at::cuda::getCurrentCUDAStream().stream(); }
double ms_of(const std::function<void()>& fn) { return mean_call_ms(fn, g_iters, current(), 5); }

struct Linear {
  const char* name;
  int64_t in, out;
  bool bias;
  int per_step;  // how many such linears one step runs
};

struct Model {
  const char* name;
  int64_t tokens;
  std::vector<Linear> linears;
};

// Column-major operands of gemm.h for row-major torch matrices.
GemmOperand rows_of(const torch::Tensor& t, bool transposed) {
  return {t.data_ptr(), DType::kBF16, t.size(1), t.size(0), t.size(1), transposed};
}

struct Timings {
  std::map<std::string, double> ms;  // variant -> ms per call
};

Timings bench_linear(const Linear& l, int64_t tokens, GemmHandle& heuristic, GemmHandle& tuned) {
  const auto bf = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kBFloat16);
  torch::manual_seed(1);
  const auto x = torch::randn({tokens, l.in}, bf), w = torch::randn({l.out, l.in}, bf) * 0.02;
  const auto b = torch::randn({l.out}, bf), dy = torch::randn({tokens, l.out}, bf);
  auto y = torch::empty({tokens, l.out}, bf), dx = torch::empty({tokens, l.in}, bf);
  auto main_grad = torch::zeros({l.out, l.in}, bf.dtype(torch::kFloat32));
  auto bias_grad = torch::zeros({l.out}, bf.dtype(torch::kFloat32));
  Timings t;

  // fprop: column-major D (out x tokens) = W^T... as nt_problem builds it.
  const RowMajorMatrix xm{x.data_ptr(), DType::kBF16, tokens, l.in, l.in}, wm{w.data_ptr(), DType::kBF16, l.out, l.in, l.in};
  GemmConfig with_bias;
  with_bias.bias = b.data_ptr();
  const GemmConfig plain;
  const GemmConfig& fprop_config = l.bias ? with_bias : plain;
  t.ms["fprop aten linear"] = ms_of([&] { l.bias ? (void)at::linear(x, w, b) : (void)at::linear(x, w); });
  t.ms["fprop aten mm (no bias)"] = ms_of([&] { at::mm_out(y, x, w.t()); });
  t.ms["fprop ours heuristic"] =
      ms_of([&] { gemm_nt(heuristic, xm, wm, y.data_ptr(), DType::kBF16, l.out, fprop_config, current()); });
  t.ms["fprop ours tuned"] = ms_of([&] { gemm_nt(tuned, xm, wm, y.data_ptr(), DType::kBF16, l.out, fprop_config, current()); });

  // dgrad: dX^T (in x tokens) = W-as-stored (in x out) * dY^T (out x tokens), both not transposed.
  const GemmOperand da = rows_of(w, false), db = rows_of(dy, false);
  const GemmOutput dd{dx.data_ptr(), DType::kBF16, l.in};
  t.ms["dgrad aten mm"] = ms_of([&] { at::mm_out(dx, dy, w); });
  t.ms["dgrad ours heuristic"] = ms_of([&] { gemm(heuristic, da, db, dd, {}, current()); });
  t.ms["dgrad ours tuned"] = ms_of([&] { gemm(tuned, da, db, dd, {}, current()); });

  // wgrad: main_grad (in x out column-major) += X (in x tokens) * dY^T (tokens x out).
  const GemmOperand wa = rows_of(x, false), wb = rows_of(dy, true);
  const GemmOutput wd{main_grad.data_ptr(), DType::kFP32, l.in};
  GemmConfig accumulate;
  accumulate.accumulate = true;
  GemmConfig accumulate_bgrad = accumulate;
  accumulate_bgrad.bias = bias_grad.data_ptr();
  accumulate_bgrad.bias_dtype = DType::kFP32;
  accumulate_bgrad.bias_gradient = true;
  t.ms["wgrad aten addmm fp32"] = ms_of([&] { at::addmm_out(main_grad, main_grad, dy.t(), x, torch::kFloat32, 1.0); });
  t.ms["wgrad aten mm bf16"] = ms_of([&] { (void)at::mm(dy.t(), x); });
  t.ms["wgrad ours heuristic"] = ms_of([&] { gemm(heuristic, wa, wb, wd, accumulate, current()); });
  t.ms["wgrad ours tuned"] = ms_of([&] { gemm(tuned, wa, wb, wd, accumulate, current()); });
  if (l.bias) {
    t.ms["wgrad+bgrad ours heuristic"] = ms_of([&] { gemm(heuristic, wa, wb, wd, accumulate_bgrad, current()); });
    t.ms["wgrad+bgrad ours tuned"] = ms_of([&] { gemm(tuned, wa, wb, wd, accumulate_bgrad, current()); });
  } else {
    t.ms["wgrad+bgrad ours heuristic"] = t.ms["wgrad ours heuristic"];
    t.ms["wgrad+bgrad ours tuned"] = t.ms["wgrad ours tuned"];
  }
  return t;
}

double tflops(double flops, double ms) { return flops / (ms * 1e-3) / 1e12; }

void bench(const Model& m, GemmHandle& heuristic, GemmHandle& tuned) {
  std::printf("\n== %s, %lld tokens per micro-batch\n", m.name, (long long)m.tokens);
  std::map<std::string, double> step;
  std::vector<std::string> order;
  for (const Linear& l : m.linears) {
    const Timings t = bench_linear(l, m.tokens, heuristic, tuned);
    const double flops = 2.0 * double(m.tokens) * double(l.in) * double(l.out);
    std::printf("-- %s %lld -> %lld%s (x%d per step)\n", l.name, (long long)l.in, (long long)l.out, l.bias ? " +bias" : "",
                l.per_step);
    for (const auto& [variant, ms] : t.ms) {
      std::printf("   %-28s %8.3f ms  %5.0f TFLOP/s\n", variant.c_str(), ms, tflops(flops, ms));
      step[variant] += ms * l.per_step;
    }
  }
  std::printf("-- one step's GEMMs (ms)\n");
  for (const auto& [variant, ms] : step) std::printf("   %-28s %8.2f\n", variant.c_str(), ms);
  const double current = step["fprop aten linear"] + step["dgrad aten mm"] + step["wgrad+bgrad ours heuristic"];
  const double compiled = step["fprop aten mm (no bias)"] + step["dgrad aten mm"] + step["wgrad aten mm bf16"];
  const double tuned_all = step["fprop ours tuned"] + step["dgrad ours tuned"] + step["wgrad+bgrad ours tuned"];
  std::printf("   today's modules (aten fprop/dgrad, heuristic wgrad) %8.2f ms\n", current);
  std::printf("   a compiled PyTorch model's GEMMs (mm, bf16 wgrad)    %8.2f ms\n", compiled);
  std::printf("   all ours, autotuned                                  %8.2f ms\n", tuned_all);
}

void print_plans(const GemmHandle& h) {
  for (const GemmPlanInfo& p : h.plan_infos()) {
    std::printf("plan %s -> rank %d of %d%s\n", p.problem.c_str(), p.heuristic_rank, p.heuristic_results,
                p.autotuned ? " (autotuned)" : "");
    for (const auto& c : p.candidates)
      std::printf("   rank %2d %8.3f ms waves %.2f ws %zu %s\n", c.heuristic_rank, c.median_ms, c.waves, c.workspace_bytes,
                  c.algo.c_str());
  }
}

}  // namespace
}  // namespace fp8tron::fp8

int main(int argc, char** argv) {
  using namespace fp8tron::fp8;
  if (!torch::cuda::is_available()) {
    std::printf("no GPU\n");
    return 0;
  }
  if (argc > 1) g_iters = std::atoi(argv[1]);
  GemmHandleOptions heuristic_options, tuned_options;
  heuristic_options.algo_selection = AlgoSelection::kHeuristic;
  tuned_options.algo_selection = AlgoSelection::kAutotune;
  GemmHandle heuristic(heuristic_options), tuned(tuned_options);
  const std::vector<Model> models = {
      {"GPT-2 124M", 16 * 1024,
       {{"qkv", 768, 2304, true, 12}, {"proj", 768, 768, true, 12}, {"fc1", 768, 3072, true, 12},
        {"fc2", 3072, 768, true, 12}, {"logits", 768, 50304, false, 1}}},
      {"GPT 1.3B", 4 * 2048,
       {{"qkv", 2048, 6144, true, 24}, {"proj", 2048, 2048, true, 24}, {"fc1", 2048, 8192, true, 24},
        {"fc2", 8192, 2048, true, 24}, {"logits", 2048, 50304, false, 1}}},
      {"LLaMA-style 1.1B", 4 * 2048,
       {{"qkv", 2048, 3072, false, 16}, {"proj", 2048, 2048, false, 16}, {"fc1", 2048, 11264, false, 16},
        {"fc2", 5632, 2048, false, 16}, {"logits", 2048, 32000, false, 1}}},
  };
  for (const auto& m : models) bench(m, heuristic, tuned);
  if (std::getenv("FP8TRON_BENCH_VERBOSE")) print_plans(tuned);
  return 0;
}
