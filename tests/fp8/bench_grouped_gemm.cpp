// MoE expert GEMMs on one GPU: fp8tron's grouped GEMMs against torch's (torch._grouped_mm and
// torch._scaled_grouped_mm through ATen, the kernels the Python calls run), on three expert shapes
// (Mixtral-like, a wide one, fine-grained DeepSeek-like; docs/performance.md), balanced and
// skewed token counts, timed the same way side by side.
//
//   GEMM only   pre-quantized operands (tensor scales of 1; torch: rowwise scales of 1), bf16
//               output, fast accumulation for FP8 (TE's fprop setting; torch: use_fast_accum):
//               ours = the per-expert cuBLASLt GEMMs on the side streams exactly as the grouped
//               linear issues them (bucketed plans); bf16 ours through cuBLASLt and through at::mm
//               per expert; dense = one GEMM over all tokens (the ceiling).
//   layer       fp8::grouped_linear as TEGroupedLinear runs it: forward with the quantize pass
//               (delayed scaling, hybrid), and forward + backward (3 GEMMs: 3x the FLOPs; the wgrad
//               adds into fp32 main gradients, as in training); torch:
//               its rowwise quantization in eager ops + _scaled_grouped_mm (forward), and
//               _grouped_mm forward + backward through autograd (bf16).
// Timing: "eager" = CUDA events around `iters` back-to-back calls after warm-up (host launch
// overhead counts when the GPU outruns it); "graph" = the same call captured once in a CUDA graph
// and replayed (GEMM only: launch overhead excluded), only with FP8TRON_BENCH_GRAPHS=1: on an H200
// (torch 2.11) one of the captured calls aborted the process (a device-to-device copy "not
// permitted when stream is capturing", not caught as an exception), so the default is eager
// only and the graph column reads "-". TFLOP/s = 2 * tokens * in * out per GEMM.
//
// Build and run (on a machine with a GPU):
//   ./scripts/build.sh fp8tron_bench_grouped_gemm && build/tests/fp8/fp8tron_bench_grouped_gemm [iters]
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <cublasLt.h>
#include <cuda_runtime_api.h>
#include <torch/torch.h>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "core/cuda/cuda_check.h"
#include "fp8/call_timer.h"
#include "fp8/fp8_grouped_linear.h"
#include "fp8/fp8_linear.h"
#include "fp8/gemm.h"
#include "fp8/grouped_gemm.h"

namespace fp8tron::fp8 {
namespace {

int g_iters = 20;
bool g_graphs = false;  // FP8TRON_BENCH_GRAPHS=1

CUstream_st* current() { return at::cuda::getCurrentCUDAStream().stream(); }

double eager_ms(const std::function<void()>& fn) { return mean_call_ms(fn, g_iters, current()); }

// fn captured once (after eager warm-up: plans and workspaces exist) and replayed.
double graph_ms(const std::function<void()>& fn) {
  for (int i = 0; i < 2; ++i) fn();
  FP8TRON_CUDA_CHECK(cudaDeviceSynchronize());
  at::cuda::CUDAGraph graph;
  const auto stream = c10::cuda::getStreamFromPool();
  {
    const c10::cuda::CUDAStreamGuard guard(stream);
    graph.capture_begin();
    fn();
    graph.capture_end();
  }
  return eager_ms([&] { graph.replay(); });
}

double tflops(double flops, double ms) { return ms > 0 ? flops / (ms * 1e-3) / 1e12 : 0.0; }

// "eager / graph" TFLOP/s of fn, or the error when it cannot run.
std::string both(double flops, const std::function<void()>& fn) {
  try {
    const double e = tflops(flops, eager_ms(fn));
    char buf[64];
    if (g_graphs) std::snprintf(buf, sizeof(buf), "%5.0f / %5.0f", e, tflops(flops, graph_ms(fn)));
    else std::snprintf(buf, sizeof(buf), "%5.0f /     -", e);
    return buf;
  } catch (const std::exception& ex) {
    return std::string("n/a (") + std::string(ex.what()).substr(0, 60) + ")";
  }
}
std::string eager(double flops, const std::function<void()>& fn) {
  try {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%5.0f", tflops(flops, eager_ms(fn)));
    return buf;
  } catch (const std::exception& ex) {
    return std::string("n/a (") + std::string(ex.what()).substr(0, 60) + ")";
  }
}

double relative_error(const torch::Tensor& a, const torch::Tensor& b) {
  auto x = a.to(torch::kFloat32), y = b.to(torch::kFloat32);
  return ((x - y).norm() / y.norm()).item<double>();
}

struct Shape {
  int experts;
  int64_t tokens, in, out;
  const char* goal;
};

void bench(const Shape& s, bool skewed) {
  const int64_t E = s.experts, K = s.in, N = s.out;
  std::vector<int64_t> splits;
  for (int64_t e = 0; e < E; ++e) splits.push_back(skewed ? (e % 2 ? s.tokens / 2 : s.tokens * 3 / 2) : s.tokens);
  int64_t M = 0;
  for (auto m : splits) M += m;
  const double flops = 2.0 * double(M) * double(K) * double(N);
  const auto bf = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kBFloat16);
  const auto f32 = bf.dtype(torch::kFloat32);
  torch::manual_seed(1);
  const auto x = torch::randn({M, K}, bf), w = torch::randn({E, N, K}, bf) * 0.02;
  const auto x8 = x.to(torch::kFloat8_e4m3fn), w8 = w.to(torch::kFloat8_e4m3fn);
  auto y = torch::empty({M, N}, bf);
  const auto one = torch::ones({1}, f32);
  std::vector<int32_t> ends;
  for (int64_t e = 0, at = 0; e < E; ++e) ends.push_back(int32_t(at += splits[size_t(e)]));
  const auto offs = torch::tensor(ends, torch::kInt32).to(torch::kCUDA);
  GroupedGemmResources& res = grouped_gemm_resources();

  // --- GEMM only -------------------------------------------------------------------------------
  auto problems = [&](bool fp8) {
    std::vector<GroupedGemm> gemms;
    int64_t row = 0;
    for (int64_t e = 0; e < E; ++e) {
      const int64_t m = splits[size_t(e)];
      const RowMajorMatrix xm = fp8 ? RowMajorMatrix{static_cast<uint8_t*>(x8.data_ptr()) + row * K, DType::kE4M3, m, K, K, one.data_ptr()}
                                    : RowMajorMatrix{static_cast<uint16_t*>(x.data_ptr()) + row * K, DType::kBF16, m, K, K};
      const RowMajorMatrix wm = fp8 ? RowMajorMatrix{static_cast<uint8_t*>(w8.data_ptr()) + e * N * K, DType::kE4M3, N, K, K, one.data_ptr()}
                                    : RowMajorMatrix{static_cast<uint16_t*>(w.data_ptr()) + e * N * K, DType::kBF16, N, K, K};
      GroupedGemm g;
      g.problem = nt_problem(xm, wm, static_cast<uint16_t*>(y.data_ptr()) + row * N, DType::kBF16, N);
      g.config.bucket = GemmBucket::kN;
      g.config.fast_accumulation = fp8;
      gemms.push_back(g);
      row += m;
    }
    return gemms;
  };
  const auto ours8 = problems(true), ours16 = problems(false);
  const auto run_ours8 = [&] { grouped_gemm(res.handle, res.streams, ours8, current()); };
  const auto run_ours16 = [&] { grouped_gemm(res.handle, res.streams, ours16, current()); };
  const auto run_ours16_mm = [&] {
    FanOut fan(res.streams, current(), size_t(E));
    int64_t row = 0;
    for (int64_t e = 0; e < E; ++e) {
      const int64_t m = splits[size_t(e)];
      const c10::cuda::CUDAStreamGuard guard(c10::cuda::getStreamFromExternal(fan.stream_for(double(m)), x.get_device()));
      auto ye = y.narrow(0, row, m);
      at::mm_out(ye, x.narrow(0, row, m), w[e].t());
      row += m;
    }
  };
  const auto sa = torch::ones({M}, f32), sb = torch::ones({E, N}, f32);
  const auto run_torch8 = [&] {
    (void)at::_scaled_grouped_mm(x8, w8.transpose(-2, -1), sa, sb, offs, {}, {}, torch::kBFloat16, true);
  };
  const auto run_torch16 = [&] { (void)at::_grouped_mm(x, w.transpose(-2, -1), offs); };
  // Dense: all tokens through expert 0's weight, one GEMM (our cuBLASLt path, heuristic plan).
  const RowMajorMatrix dx8{x8.data_ptr(), DType::kE4M3, M, K, K, one.data_ptr()}, dw8{w8.data_ptr(), DType::kE4M3, N, K, K, one.data_ptr()};
  const RowMajorMatrix dx16{x.data_ptr(), DType::kBF16, M, K, K}, dw16{w.data_ptr(), DType::kBF16, N, K, K};
  GemmConfig fast;
  fast.fast_accumulation = true;
  const auto run_dense8 = [&] { gemm_nt(res.handle, dx8, dw8, y.data_ptr(), DType::kBF16, N, fast, current()); };
  const auto run_dense16 = [&] { gemm_nt(res.handle, dx16, dw16, y.data_ptr(), DType::kBF16, N, {}, current()); };

  // Same numbers? (ours vs torch on the same operands)
  run_ours8();
  const auto y_ours8 = y.clone();
  const auto y_torch8 = at::_scaled_grouped_mm(x8, w8.transpose(-2, -1), sa, sb, offs, {}, {}, torch::kBFloat16, true);
  run_ours16();
  const auto y_ours16 = y.clone();
  const auto y_torch16 = at::_grouped_mm(x, w.transpose(-2, -1), offs);

  std::printf("\n== %d x %lld tokens%s, %lld -> %lld (M = %lld); goal %s\n", s.experts, (long long)s.tokens,
              skewed ? " (skewed: alternately 1/2 and 3/2 x)" : "", (long long)K, (long long)N, (long long)M, s.goal);
  std::printf("   agreement: FP8 ours vs torch %.1e, bf16 ours vs torch %.1e (relative)\n", relative_error(y_ours8, y_torch8),
              relative_error(y_ours16, y_torch16));
  std::printf("   GEMM only, TFLOP/s eager / graph\n");
  std::printf("   FP8   fp8tron grouped (4 streams)     %s\n", both(flops, run_ours8).c_str());
  std::printf("   FP8   torch._scaled_grouped_mm        %s\n", both(flops, run_torch8).c_str());
  std::printf("   FP8   dense (one GEMM, same tokens)   %s\n", both(flops, run_dense8).c_str());
  std::printf("   bf16  fp8tron grouped cuBLASLt        %s\n", both(flops, run_ours16).c_str());
  std::printf("   bf16  fp8tron grouped at::mm          %s\n", both(flops, run_ours16_mm).c_str());
  std::printf("   bf16  torch._grouped_mm               %s\n", both(flops, run_torch16).c_str());
  std::printf("   bf16  dense (one GEMM, same tokens)   %s\n", both(flops, run_dense16).c_str());
  if (skewed) return;

  // --- the layer --------------------------------------------------------------------------------
  Fp8EngineOptions o;
  o.recipe = make_recipe(RecipeKind::kDelayed, Fp8Format::kHybrid);
  o.num_layers = 1;
  Fp8Engine engine(o, torch::Device(torch::kCUDA, x.get_device()));
  std::vector<std::shared_ptr<Fp8Site>> owned;
  std::vector<Fp8Site*> sites;
  std::vector<torch::Tensor> weights, biases(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e) {
    owned.push_back(engine.add_site("decoder.layers.0.mlp.experts.linear_fc1.weight" + std::to_string(e), 0, N, K));
    sites.push_back(owned.back().get());
    weights.push_back(w[e].clone().requires_grad_(true));
    // As in training: an fp32 main gradient the wgrad GEMM adds into.
    weights.back().mutable_grad() = torch::zeros({N, K}, f32);
  }
  const auto xg = x.clone().requires_grad_(true);
  const auto dy = torch::randn({M, N}, bf) * 1e-3;
  auto fwd = [&](const std::vector<Fp8Site*>& ss) {
    return [&, ss] { (void)grouped_linear(xg, splits, weights, biases, ss); };
  };
  auto fwd_bwd = [&](const std::vector<Fp8Site*>& ss) {
    return [&, ss] {
      xg.mutable_grad() = torch::Tensor();
      grouped_linear(xg, splits, weights, biases, ss).backward(dy);
    };
  };
  const auto wt_torch = w.transpose(-2, -1).clone().requires_grad_(true);
  const auto run_torch_quant_fwd = [&] {  // rowwise quantization in eager torch, then the grouped GEMM
    const auto amax = x.abs().amax(1).to(torch::kFloat32).clamp_min(1e-12);
    const auto scale = 448.0 / amax;
    const auto xq = (x.to(torch::kFloat32) * scale.unsqueeze(1)).to(torch::kFloat8_e4m3fn);
    (void)at::_scaled_grouped_mm(xq, w8.transpose(-2, -1), scale.reciprocal(), sb, offs, {}, {}, torch::kBFloat16, true);
  };
  const auto run_torch16_fwd_bwd = [&] {
    wt_torch.mutable_grad() = torch::Tensor();
    xg.mutable_grad() = torch::Tensor();
    at::_grouped_mm(xg, wt_torch, offs).backward(dy);
  };
  std::printf("   layer, TFLOP/s eager\n");
  std::printf("   FP8   fp8tron forward (quantize + GEMMs)        %s\n", eager(flops, fwd(sites)).c_str());
  std::printf("   FP8   torch quantize (eager) + scaled_grouped  %s\n", eager(flops, run_torch_quant_fwd).c_str());
  std::printf("   FP8   fp8tron forward + backward               %s\n", eager(3 * flops, fwd_bwd(sites)).c_str());
  std::printf("   bf16  fp8tron forward                          %s\n", eager(flops, fwd({})).c_str());
  std::printf("   bf16  fp8tron forward + backward               %s\n", eager(3 * flops, fwd_bwd({})).c_str());
  std::printf("   bf16  torch._grouped_mm forward + backward     %s\n", eager(3 * flops, run_torch16_fwd_bwd).c_str());
}

}  // namespace
}  // namespace fp8tron::fp8

int main(int argc, char** argv) {
  using namespace fp8tron::fp8;
  if (!torch::cuda::is_available()) {
    std::fprintf(stderr, "no CUDA device\n");
    return 1;
  }
  if (argc > 1) g_iters = std::max(1, std::atoi(argv[1]));
  const char* graphs = std::getenv("FP8TRON_BENCH_GRAPHS");
  g_graphs = graphs != nullptr && std::string(graphs) == "1";
  cudaDeviceProp prop{};
  FP8TRON_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("[grouped-bench] %s, torch %d.%d.%d, cuBLASLt %zu, %d iterations per timing\n", prop.name,
              TORCH_VERSION_MAJOR, TORCH_VERSION_MINOR, TORCH_VERSION_PATCH, cublasLtGetVersion(), g_iters);
  const Shape shapes[] = {{8, 4096, 2048, 5632, "bf16 >= torch (680), FP8 >= 1200"},
                          {8, 4096, 4096, 14336, "bf16 >= torch (667), FP8 >= 1100"},
                          {64, 1536, 2048, 1408, "bf16 >= torch (552), FP8 >= 900"}};
  for (const Shape& s : shapes) {
    bench(s, false);
    bench(s, true);
  }
  std::printf("\n");
  size_t bucketed = 0;
  int64_t misses = 0;
  for (const auto& info : grouped_gemm_resources().handle.plan_infos()) {
    bucketed += info.bucketed ? 1 : 0;
    misses += info.bucket_misses;
  }
  std::printf("[grouped-bench] grouped GEMM plans: %zu (%zu bucketed), %lld bucket misses\n",
              grouped_gemm_resources().handle.cached_plans(), bucketed, (long long)misses);
  return 0;
}
