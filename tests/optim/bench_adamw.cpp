// The optimizer step's passes over the flat buffers on one GPU, timed side by side:
//   torch   at::_fused_adamw_ on one segment, then the fp32 -> bf16 copy of the model parameters
//           (the optimizer's path before the fused kernel);
//   ours    fused_adamw writing the bf16 copy in the same pass (optim/fused_adamw.h), and
//           without a copy (fp32 parameters);
//   norm    the gradient norm's squares as the optimizer takes them (at::dot over 2^30-element
//           chunks), and zero_grad()'s zero_ of the gradients, for scale.
// Each line gives ms per call (CUDA events around `iters` calls after warm-up) and the effective
// bandwidth: bytes the pass must move / time (AdamW 28 B per parameter, + 2 for the bf16 copy; the
// separate copy 6; the norm 4; zeroing 4).
//
// Build and run (on a machine with a GPU):
//   ./scripts/build.sh fp8tron_bench_adamw && build/tests/fp8tron_bench_adamw [billions of parameters (1.1)] [iters (10)]
// 4.73 billion (the Mixtral-style MoE) needs ~86 GB: an H200.
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#include <torch/torch.h>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <optional>

#include "core/cuda/cuda_check.h"
#include "tests/fp8/gpu_test_util.h"
#include "optim/fused_adamw.h"

namespace fp8tron {
namespace {

double time_ms(int iters, const std::function<void()>& fn) { return fp8::testing::time_ms(fn, 2, iters); }

void report(const char* what, double ms, double bytes) {
  std::printf("%-44s %9.3f ms  %6.2f TB/s\n", what, ms, bytes / (ms * 1e-3) / 1e12);
}

int run(double billions, int iters) {
  if (!torch::cuda::is_available()) {
    std::fprintf(stderr, "no CUDA device\n");
    return 1;
  }
  const int64_t n = int64_t(billions * 1e9);
  const auto f32 = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kFloat32);
  torch::NoGradGuard no_grad;
  auto p = torch::randn({n}, f32), g = torch::randn({n}, f32).mul_(1e-3), m = torch::zeros({n}, f32),
       v = torch::zeros({n}, f32);
  auto model = p.to(torch::kBFloat16);
  auto step = torch::zeros({}, f32);
  const auto found_inf = torch::zeros({}, f32);
  const std::optional<torch::Tensor> divisor = torch::full({}, 1.25, f32);  // a folded clip coefficient
  const double lr = 1e-4, beta1 = 0.9, beta2 = 0.95, eps = 1e-8, wd = 0.1;
  const double P = double(n);
  std::printf("%lld parameters (fp32 main weights, bf16 model copy), %d iterations\n", (long long)n, iters);

  const double torch_adam = time_ms(iters, [&] {
    step.add_(1);
    at::_fused_adamw_({p}, {g}, {m}, {v}, {}, {step}, lr, beta1, beta2, wd, eps, false, false, divisor, found_inf);
  });
  const double copy = time_ms(iters, [&] { model.copy_(p); });
  report("torch _fused_adamw_ (writes g back)", torch_adam, 32 * P);
  report("bf16 copy of the parameters", copy, 6 * P);
  report("torch path total", torch_adam + copy, 34 * P);
  const double ours_copy = time_ms(iters, [&] {
    step.add_(1);
    fused_adamw({p, g, m, v, model}, step, found_inf, divisor, {lr, beta1, beta2, eps, wd});
  });
  report("ours, bf16 copy in the same pass", ours_copy, 30 * P);
  const double ours = time_ms(iters, [&] {
    step.add_(1);
    fused_adamw({p, g, m, v, {}}, step, found_inf, divisor, {lr, beta1, beta2, eps, wd});
  });
  report("ours, no copy", ours, 28 * P);
  std::printf("speed-up of the step with the copy: %.2fx (%.2f ms saved)\n", (torch_adam + copy) / ours_copy,
              torch_adam + copy - ours_copy);

  const double norm = time_ms(iters, [&] {
    constexpr int64_t kChunk = int64_t{1} << 30;
    torch::Tensor total;
    for (int64_t at = 0; at < n; at += kChunk) {
      const auto c = g.narrow(0, at, std::min(kChunk, n - at));
      total = total.defined() ? total + at::dot(c, c) : at::dot(c, c);
    }
  });
  report("gradient squares (at::dot, 2^30 chunks)", norm, 4 * P);
  const double zero = time_ms(iters, [&] { m.zero_(); });
  report("zero_ of an fp32 buffer", zero, 4 * P);
  return 0;
}

}  // namespace
}  // namespace fp8tron

int main(int argc, char** argv) {
  const double billions = argc > 1 ? std::atof(argv[1]) : 1.1;
  const int iters = argc > 2 ? std::atoi(argv[2]) : 10;
  return fp8tron::run(billions, iters);
}
