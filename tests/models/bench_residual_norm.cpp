// The fused residual add + norm (models/norm/residual_norm.h) against the unfused chain it replaced
// (torch's add, then at::layer_norm / at::rms_norm), on one GPU, at the shapes of the benchmark
// models (configs/*.json: tokens per micro-batch x hidden): forward alone, and forward + backward
// (torch::autograd::grad of both outputs, so no gradient accumulation into leaves is timed). The
// "no branch" rows are the plain norm (a layer's input norm after the embedding): the same kernels
// against torch's norm alone. CUDA events around `iters` back-to-back calls after warm-up; GB/s
// counts each kernel design's compulsory traffic (fused forward: read 2, write 2 tensors; fused
// backward: read 3, write 1), the same bytes for both columns.
//
// Build and run (on a machine with a GPU):
//   ./scripts/build.sh fp8tron_bench_residual_norm && build/tests/fp8tron_bench_residual_norm [iters]
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#include <torch/torch.h>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>

#include "core/cuda/cuda_check.h"
#include "tests/fp8/gpu_test_util.h"
#include "models/norm/residual_norm.h"

namespace fp8tron {
namespace {

int g_iters = 50;

double ms_per_call(const std::function<void()>& fn) { return fp8::testing::time_ms(fn, 5, g_iters); }

struct Case {
  const char* model;
  int64_t tokens, hidden;
  Normalization kind;
  bool branch;
};

void bench(const Case& c) {
  const auto opts = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kBFloat16);
  const NormOptions o{c.hidden, c.kind, 1e-5, false};
  auto leaf = [&](torch::Tensor t) { return t.to(opts).requires_grad_(true); };
  const auto residual = leaf(torch::randn({c.tokens, c.hidden}));
  const auto branch = c.branch ? leaf(torch::randn({c.tokens, c.hidden})) : torch::Tensor();
  const auto weight = leaf(torch::ones({c.hidden}));
  const auto bias = c.kind == Normalization::LayerNorm ? leaf(torch::zeros({c.hidden})) : torch::Tensor();
  const auto g_sum = torch::randn({c.tokens, c.hidden}, opts), g_normed = torch::randn({c.tokens, c.hidden}, opts);
  torch::autograd::variable_list inputs = {residual, weight};
  if (branch.defined()) inputs.push_back(branch);
  if (bias.defined()) inputs.push_back(bias);

  using Op = std::function<ResidualNormOutput()>;
  const Op fused = [&] { return residual_add_norm(residual, branch, o, weight, bias); };
  const Op chain = [&] { return unfused_residual_add_norm(residual, branch, o, weight, bias); };
  auto forward = [&](const Op& op) {
    torch::NoGradGuard no_grad;
    return ms_per_call([&] { op(); });
  };
  auto both = [&](const Op& op) {
    return ms_per_call([&] {
      const auto out = op();
      if (branch.defined())
        torch::autograd::grad({out.sum, out.normed}, inputs, {g_sum, g_normed});
      else
        torch::autograd::grad({out.normed}, inputs, {g_normed});
    });
  };
  const double f_fused = forward(fused), f_chain = forward(chain), b_fused = both(fused), b_chain = both(chain);
  const double tensor_gb = double(c.tokens * c.hidden * 2) / 1e9;
  const double fwd_gb = (c.branch ? 4 : 2) * tensor_gb, bwd_gb = (c.branch ? 4 : 3) * tensor_gb;
  std::printf("| %s | %lld x %lld | %s%s | %.1f us (%.0f GB/s) | %.1f us | %.2fx | %.1f us (%.0f GB/s) | %.1f us | %.2fx |\n",
              c.model, (long long)c.tokens, (long long)c.hidden, c.kind == Normalization::RMSNorm ? "RMSNorm" : "LayerNorm",
              c.branch ? "" : ", no branch", 1e3 * f_fused, fwd_gb / (f_fused * 1e-3), 1e3 * f_chain, f_chain / f_fused,
              1e3 * b_fused, (fwd_gb + bwd_gb) / (b_fused * 1e-3), 1e3 * b_chain, b_chain / b_fused);
}

}  // namespace
}  // namespace fp8tron

int main(int argc, char** argv) {
  using namespace fp8tron;
  if (!torch::cuda::is_available()) {
    std::printf("no CUDA device\n");
    return 77;
  }
  if (argc > 1) g_iters = std::max(1, std::atoi(argv[1]));
  std::printf("| model | tokens x hidden | norm | fused forward | unfused forward | speed-up | fused fwd+bwd | "
              "unfused fwd+bwd | speed-up |\n");
  std::printf("| --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
  const Case cases[] = {
      {"GPT-2 124M", 16 * 1024, 768, Normalization::LayerNorm, true},
      {"GPT-2 124M", 16 * 1024, 768, Normalization::LayerNorm, false},
      {"GPT 1.3B", 4 * 2048, 2048, Normalization::LayerNorm, true},
      {"LLaMA-style 1.1B", 4 * 2048, 2048, Normalization::RMSNorm, true},
      {"LLaMA-style 1.1B", 4 * 2048, 2048, Normalization::RMSNorm, false},
      {"hidden 4096", 8192, 4096, Normalization::RMSNorm, true},
      {"wide-8k", 2048, 8192, Normalization::LayerNorm, true},
  };
  for (const Case& c : cases) bench(c);
  return 0;
}
