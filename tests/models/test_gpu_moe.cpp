// GPU tests of the mixture of experts (label gpu; skipped without a CUDA device, failing when the
// results differ): the permutation kernels against the CPU path (bitwise where the math is a copy
// or a fixed-order fp32 sum), and the MoE model training in fp32 (against the CPU), bf16 and FP8.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdio>

#include "core/text.h"
#include "models/moe/aux_loss.h"
#include "models/moe/fused_topk_routing.h"
#include "models/moe/permute.h"
#include "models/moe/routing.h"
#include "tests/test_helpers.h"
#include "trainer/trainer.h"

namespace fp8tron {
namespace {
using namespace fp8tron::testing;

#define REQUIRE_GPU() \
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device"

std::vector<int64_t> column_counts(const torch::Tensor& map) {
  auto c = map.sum(0).to(torch::kCPU, torch::kInt64);
  return std::vector<int64_t>(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
}

// Routing maps of `experts` columns, top-k per token, with an idle expert and a skewed one.
torch::Tensor skewed_map(int64_t tokens, int64_t experts, int64_t k) {
  auto scores = torch::rand({tokens, experts});
  scores.select(1, 0).add_(0.5);  // expert 0 popular
  scores.select(1, experts - 1).fill_(-1);  // the last expert idle
  auto idx = std::get<1>(scores.topk(k, 1));
  return torch::zeros({tokens, experts}, torch::kInt32).scatter(1, idx, 1).to(torch::kBool);
}

TEST(GpuMoe, PermuteKernelsMatchTheCpuPath) {
  REQUIRE_GPU();
  const auto cuda = torch::Device(torch::kCUDA, 0);
  torch::manual_seed(1);
  for (auto dtype : {torch::kFloat32, torch::kBFloat16}) {
    for (auto [tokens, experts, hidden, k] : std::vector<std::tuple<int64_t, int64_t, int64_t, int64_t>>{
             {512, 8, 256, 2}, {1000, 64, 72, 6}, {33, 4, 7, 1}, {300, 1000, 32, 4}}) {
      SCOPED_TRACE(strprintf("%s T=%lld E=%lld H=%lld k=%lld", c10::toString(dtype), (long long)tokens, (long long)experts,
                             (long long)hidden, (long long)k));
      const auto map = skewed_map(tokens, experts, k);
      const auto counts = column_counts(map);
      const auto cpu_index = moe::make_permute_index(map, counts);
      const auto gpu_index = moe::make_permute_index(map.to(cuda), counts);
      EXPECT_TRUE(torch::equal(cpu_index.row_of, gpu_index.row_of.cpu()));
      EXPECT_TRUE(torch::equal(cpu_index.flat_of_row, gpu_index.flat_of_row.cpu()));
      // (1000 experts: fewer warps per block in the per-token kernels, whose shared memory holds
      // each warp's routes.) The index kernel also pads the experts' rows (--moe-router-padding-for-quantization) and
      // reads a map that is a column slice of a wider one (the allgather dispatcher's local experts).
      const int64_t pad = tokens >= 512 ? 16 : 2;
      const auto padded_cpu = moe::make_permute_index(map, counts, pad);
      const auto wide = torch::cat({skewed_map(tokens, experts, k), map}, 1).to(cuda);
      const auto padded_gpu = moe::make_permute_index(wide.narrow(1, experts, experts), counts, pad);
      EXPECT_EQ(padded_cpu.counts, padded_gpu.counts);
      EXPECT_GT(padded_cpu.rows, cpu_index.rows);
      EXPECT_TRUE(torch::equal(padded_cpu.row_of, padded_gpu.row_of.cpu()));
      EXPECT_TRUE(torch::equal(padded_cpu.flat_of_row, padded_gpu.flat_of_row.cpu()));
      auto x = torch::randn({tokens, hidden}).to(dtype);
      auto probs = (torch::rand({tokens, experts}) * map).to(torch::kFloat32);
      // permute: a gather, bitwise.
      auto x_gpu = x.to(cuda).requires_grad_(true), x_cpu = x.clone().requires_grad_(true);
      auto rows_gpu = moe::permute(x_gpu, gpu_index), rows_cpu = moe::permute(x_cpu, cpu_index);
      EXPECT_TRUE(torch::equal(rows_gpu.cpu(), rows_cpu));
      // unpermute with probs: the same fp32 sums in the same order, bitwise; in both out dtypes.
      auto y = torch::randn({cpu_index.rows, hidden}).to(dtype);
      auto p_gpu = probs.to(cuda).requires_grad_(true), p_cpu = probs.clone().requires_grad_(true);
      auto y_gpu = y.to(cuda).requires_grad_(true), y_cpu = y.clone().requires_grad_(true);
      auto out_gpu = moe::unpermute(y_gpu, gpu_index, p_gpu, dtype);
      auto out_cpu = moe::unpermute(y_cpu, cpu_index, p_cpu, dtype);
      EXPECT_TRUE(torch::equal(out_gpu.cpu(), out_cpu));
      EXPECT_TRUE(torch::equal(moe::unpermute(y.to(cuda), gpu_index, probs.to(cuda), torch::kFloat32).cpu(),
                               moe::unpermute(y, cpu_index, probs, torch::kFloat32)));
      // Backward: dy (a scaled gather) bitwise; dprobs (dot products) to fp32 rounding.
      auto g = torch::randn({tokens, hidden}).to(dtype);
      out_gpu.backward(g.to(cuda));
      out_cpu.backward(g);
      EXPECT_TRUE(torch::equal(y_gpu.grad().cpu(), y_cpu.grad()));
      EXPECT_TRUE(torch::allclose(p_gpu.grad().cpu(), p_cpu.grad(), 1e-4, 1e-4));
      // permute's backward is the unweighted combine: bitwise.
      auto d = torch::randn({cpu_index.rows, hidden}).to(dtype);
      rows_gpu.backward(d.to(cuda));
      rows_cpu.backward(d);
      EXPECT_TRUE(torch::equal(x_gpu.grad().cpu(), x_cpu.grad()));
      // sort_chunks: a reordering, bitwise, forward and backward.
      std::vector<int64_t> sizes = counts, order;
      for (int64_t e = experts - 1; e >= 0; --e) order.push_back(e);
      auto s_gpu = moe::sort_chunks(y.to(cuda), sizes, order), s_cpu = moe::sort_chunks(y, sizes, order);
      EXPECT_TRUE(torch::equal(s_gpu.cpu(), s_cpu));
    }
  }
}

// The fused softmax top-k kernel against the torch operations it replaces (topk_routing and
// aux_loss_scores on the same GPU logits): the same selections and counts, probs and scores to
// fp32 rounding, and the same logit gradients through both outputs.
TEST(GpuMoe, FusedTopkRoutingMatchesTheTorchPath) {
  REQUIRE_GPU();
  const auto cuda = torch::Device(torch::kCUDA, 0);
  torch::manual_seed(3);
  for (auto dtype : {torch::kFloat32, torch::kBFloat16}) {
    for (auto [experts, k, pre, scale] : std::vector<std::tuple<int64_t, int64_t, bool, double>>{
             {8, 2, false, 0.0}, {8, 1, true, 0.0}, {64, 6, false, 2.5}, {100, 8, true, 1.5}, {8, 8, false, 0.0}}) {
      SCOPED_TRACE(strprintf("%s E=%lld k=%lld pre=%d scale=%g", c10::toString(dtype), (long long)experts, (long long)k,
                             int(pre), scale));
      moe::TopKOptions o;
      o.topk = k;
      o.pre_softmax = pre;
      if (scale != 0.0) o.scaling_factor = scale;
      // Distinct logits (a permutation of a grid per token): no ties, in either dtype.
      const int64_t tokens = 777;
      auto grid = torch::linspace(-4, 4, experts).to(torch::kFloat32);
      auto order = std::get<1>(torch::rand({tokens, experts}).sort(1));
      auto logits = grid.index_select(0, order.reshape({-1})).view({tokens, experts}).to(dtype).to(cuda);
      ASSERT_TRUE(moe::fused_routing_applies(logits, o));
      auto a = logits.clone().requires_grad_(true), b = logits.clone().requires_grad_(true);
      const auto fused = moe::fused_topk_softmax(a, o);
      const auto want = moe::topk_routing(b, o);
      const auto want_aux = moe::aux_loss_scores(b, k, MoeScoreFunction::kSoftmax);
      EXPECT_TRUE(torch::equal(fused.routing.map.cpu(), want.map.cpu()));
      EXPECT_TRUE(torch::equal(fused.routing.counts.cpu(), want.map.sum(0).cpu()));
      EXPECT_TRUE(torch::equal(fused.aux.map.cpu(), want_aux.map.cpu()));
      EXPECT_TRUE(torch::equal(fused.aux.counts.cpu(), want_aux.map.sum(0, false, torch::kFloat32).cpu()));
      const double tol = dtype == torch::kFloat32 ? 1e-6 : 8e-3;
      EXPECT_EQ(fused.routing.probs.scalar_type(), dtype);
      EXPECT_TRUE(torch::allclose(fused.routing.probs.to(torch::kFloat32).cpu(), want.probs.to(torch::kFloat32).cpu(), tol, tol));
      EXPECT_TRUE(torch::allclose(fused.aux.scores.cpu(), want_aux.scores.cpu(), 1e-6, 1e-6));
      // Gradients through both outputs at once.
      auto wp = torch::randn({tokens, experts}, torch::TensorOptions().device(cuda));
      auto ws = torch::randn({tokens, experts}, torch::TensorOptions().device(cuda));
      ((fused.routing.probs.to(torch::kFloat32) * wp).sum() + (fused.aux.scores * ws).sum()).backward();
      ((want.probs.to(torch::kFloat32) * wp).sum() + (want_aux.scores * ws).sum()).backward();
      EXPECT_EQ(a.grad().scalar_type(), dtype);
      const double gtol = dtype == torch::kFloat32 ? 1e-5 : 2e-2;
      EXPECT_TRUE(torch::allclose(a.grad().to(torch::kFloat32).cpu(), b.grad().to(torch::kFloat32).cpu(), gtol, gtol))
          << (a.grad().to(torch::kFloat32) - b.grad().to(torch::kFloat32)).abs().max();
    }
  }
}

Config moe_gpu_config(const std::vector<std::string>& extra) {
  auto args = tiny_args({"--hidden-size", "128", "--num-attention-heads", "4", "--seq-length", "128",
                         "--micro-batch-size", "8", "--global-batch-size", "16", "--vocab-size", "512", "--lr", "3e-3",
                         "--attention-dropout", "0", "--hidden-dropout", "0", "--log-interval", "1000", "--eval-iters", "0",
                         "--num-experts", "8", "--moe-router-topk", "2", "--moe-ffn-hidden-size", "256",
                         "--moe-aux-loss-coeff", "1e-2", "--moe-router-dtype", "fp32", "--swiglu", "--disable-bias-linear"});
  args.insert(args.end(), extra.begin(), extra.end());
  return build_config(parse(args), LaunchEnv{}, /*gpu_available=*/true);
}

// fp32 on the GPU against the CPU: same weights, same routing, losses to fp32 rounding.
TEST(GpuMoe, Fp32MatchesCpuWithEachDispatcher) {
  REQUIRE_GPU();
  for (const char* dispatcher : {"allgather", "alltoall"}) {
    const auto gpu = train(moe_gpu_config({"--train-iters", "3", "--device", "cuda", "--moe-token-dispatcher-type", dispatcher}));
    const auto cpu = train(moe_gpu_config({"--train-iters", "3", "--device", "cpu", "--moe-token-dispatcher-type", dispatcher}));
    for (size_t i = 0; i < 3; ++i)
      EXPECT_NEAR(gpu.losses[i], cpu.losses[i], 5e-4 * cpu.losses[i]) << dispatcher << " iteration " << i + 1;
  }
}

// bf16 trains; FP8 (each recipe with an FP8 grouped GEMM, experts padding their own inputs, or
// the routing map padded for FP8 with alltoall) tracks it.
TEST(GpuMoe, Bf16AndFp8Train) {
  REQUIRE_GPU();
  const auto bf16 = train(moe_gpu_config({"--bf16", "--train-iters", "60", "--device", "cuda"}));
  EXPECT_LT(bf16.losses.back(), 0.6 * bf16.losses.front());
  for (auto extra : {std::vector<std::string>{"--fp8-recipe", "delayed"},
                     std::vector<std::string>{"--fp8-recipe", "tensorwise"},
                     std::vector<std::string>{"--fp8-recipe", "delayed", "--moe-token-dispatcher-type", "alltoall",
                                              "--moe-router-padding-for-fp8"}}) {
    std::vector<std::string> args = {"--bf16", "--train-iters", "60", "--device", "cuda", "--fp8-format", "hybrid"};
    args.insert(args.end(), extra.begin(), extra.end());
    const auto fp8 = train(moe_gpu_config(args));
    const double a = bf16.losses.back(), b = fp8.losses.back();
    std::printf("[moe-fp8] %s: loss %.4f (bf16 %.4f, first %.4f)\n", extra[1].c_str(), b, a, fp8.losses.front());
    EXPECT_LT(b, 0.6 * fp8.losses.front());
    EXPECT_LT(std::abs(b - a) / a, 0.05);
  }
}

// --moe-shared-expert-overlap runs the shared expert on a side stream during the dispatch: the same
// math (fp32: the same losses to rounding), and bf16 trains as without it.
TEST(GpuMoe, SharedExpertOverlapKeepsTheMath) {
  REQUIRE_GPU();
  const std::vector<std::string> shared = {"--moe-shared-expert-intermediate-size", "256", "--moe-shared-expert-gate",
                                           "--moe-token-dispatcher-type", "alltoall", "--device", "cuda", "--train-iters", "5"};
  auto with = shared;
  with.push_back("--moe-shared-expert-overlap");
  const auto a = train(moe_gpu_config(shared)), b = train(moe_gpu_config(with));
  for (size_t i = 0; i < a.losses.size(); ++i) EXPECT_NEAR(a.losses[i], b.losses[i], 1e-5 * a.losses[i]) << i;
  auto bf16 = with;
  bf16.insert(bf16.end(), {"--bf16", "--train-iters", "40"});
  const auto r = train(moe_gpu_config(bf16));
  EXPECT_LT(r.losses.back(), 0.7 * r.losses.front());
}

}  // namespace
}  // namespace fp8tron
