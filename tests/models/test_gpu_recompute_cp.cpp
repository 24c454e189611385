// GPU tests of activation recomputation and the context-parallel attention blocks (ctest label
// `gpu`): skipped without a CUDA device; a difference is a failure, never a skip. The
// multi-GPU context-parallel layouts run through fp8tron_parallel_equivalence
// (scripts/gpu_check.sh equivalence).
#include <gtest/gtest.h>

#include <c10/cuda/CUDACachingAllocator.h>

#include <cmath>
#include <cstdio>

#include "models/attention/attention_block.h"
#include "tests/models/small_gpu_run.h"

namespace fp8tron {
namespace {
using namespace fp8tron::testing;

#define REQUIRE_GPU() \
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device"

// Deterministic kernels, dropout on (the fused attention kernels' Philox state and the hidden
// dropout's generator must replay): every recompute layout gives bitwise the run without it, in
// bf16 and with FP8 delayed scaling (the replay must not record amaxes).
TEST(RecomputeGpu, EveryGranularityTrainsBitwiseAsWithoutRecomputation) {
  REQUIRE_GPU();
  for (const std::vector<std::string>& precision : {std::vector<std::string>{}, std::vector<std::string>{"--fp8-format", "hybrid"}}) {
    const TrainResult plain = train_small_gpu_run(precision);
    for (std::vector<std::string> layout :
         {std::vector<std::string>{"--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"},
          std::vector<std::string>{"--recompute-granularity", "full", "--recompute-method", "block", "--recompute-num-layers", "2"},
          std::vector<std::string>{"--recompute-granularity", "selective", "--recompute-modules", "core_attn", "mlp"}}) {
      std::string what = precision.empty() ? "bf16 " : "fp8 ";
      for (const auto& a : layout) what += a + " ";
      layout.insert(layout.end(), precision.begin(), precision.end());
      const TrainResult r = train_small_gpu_run(layout);
      ASSERT_EQ(r.losses.size(), plain.losses.size()) << what;
      for (size_t i = 0; i < r.losses.size(); ++i) EXPECT_EQ(r.losses[i], plain.losses[i]) << what << " iteration " << i + 1;
      for (const auto& [name, w] : plain.final_weights)
        EXPECT_TRUE(torch::equal(w, r.final_weights.at(name))) << what << ": " << name;
    }
  }
}

// Mixture of experts and multi-latent attention on the GPU: every module Megatron recomputes there
// (the whole MoE layer, the shared expert, the experts' activation and the pre-MLP norm, whose
// outputs are freed and written back before their consumer's backward; MLA's up projections,
// input norm and core attention) trains bitwise as without recomputation, bf16 and FP8
// (tensorwise for the output-discarding modules, which Megatron refuses with delayed scaling).
TEST(RecomputeGpu, MixtureOfExpertsAndMlaTrainBitwiseAsWithoutRecomputation) {
  REQUIRE_GPU();
  const std::vector<std::string> moe = {"--num-experts", "4", "--moe-router-topk", "2", "--moe-ffn-hidden-size", "128",
                                        "--moe-layer-freq", "([0]+[1]*3)", "--moe-aux-loss-coeff", "1e-2",
                                        "--moe-z-loss-coeff", "1e-3", "--moe-shared-expert-intermediate-size", "128",
                                        "--disable-bias-linear", "--moe-grouped-gemm", "--moe-token-dispatcher-type", "alltoall"};
  const std::vector<std::string> mla = {"--multi-latent-attention", "--q-lora-rank", "64", "--kv-lora-rank", "64",
                                        "--qk-head-dim", "32", "--qk-pos-emb-head-dim", "32", "--v-head-dim", "32",
                                        "--position-embedding-type", "rope", "--disable-bias-linear"};
  const std::vector<std::string> tensorwise = {"--fp8-format", "hybrid", "--fp8-recipe", "tensorwise"};
  struct Case {
    std::vector<std::string> model, layout;
  };
  const std::vector<Case> cases = {
      {moe, {"--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"}},
      {moe, {"--recompute-granularity", "selective", "--recompute-modules", "moe", "shared_experts"}},
      {moe, {"--recompute-granularity", "selective", "--recompute-modules", "moe_act", "layernorm", "shared_experts"}},
      // SwiGLU experts: the fused SwiGLU kernel replayed by moe_act and under shared_experts.
      {with(moe, {"--swiglu"}), {"--recompute-granularity", "selective", "--recompute-modules", "moe_act", "shared_experts"}},
      {with(moe, tensorwise), {"--recompute-granularity", "selective", "--recompute-modules", "moe_act", "layernorm"}},
      {with(moe, {"--fp8-format", "hybrid"}), {"--recompute-granularity", "selective", "--recompute-modules", "moe"}},
      {mla, {"--recompute-granularity", "selective", "--recompute-modules", "mla_up_proj", "layernorm", "core_attn"}},
      {with(mla, tensorwise), {"--recompute-granularity", "selective", "--recompute-modules", "mla_up_proj", "layernorm"}},
  };
  for (const Case& c : cases) {
    std::string what;
    for (const auto& a : with(c.model, c.layout)) what += a + " ";
    const TrainResult plain = train_small_gpu_run(c.model);
    const TrainResult r = train_small_gpu_run(with(c.model, c.layout));
    ASSERT_EQ(r.losses.size(), plain.losses.size()) << what;
    for (size_t i = 0; i < r.losses.size(); ++i) EXPECT_EQ(r.losses[i], plain.losses[i]) << what << " iteration " << i + 1;
    for (const auto& [name, w] : plain.final_weights)
      EXPECT_TRUE(torch::equal(w, r.final_weights.at(name))) << what << ": " << name;
  }
}

// Peak memory of training steps (the caching allocator's peak of allocated bytes) with and without
// full recomputation, on a model whose activations dominate: the saved activations of 8 layers
// shrink to 8 layer inputs plus one layer's replay. On an H200 0.61x since the run without
// recomputation no longer keeps the norms' outputs for the qkv and fc1 GEMMs (models/linear/norm_linear.h),
// which lowered the baseline.
TEST(RecomputeGpu, FullRecomputationLowersPeakMemory) {
  REQUIRE_GPU();
  auto peak = [](const std::vector<std::string>& extra) {
    std::vector<std::string> a = {"--num-layers", "8", "--hidden-size", "512", "--num-attention-heads", "8", "--seq-length",
                                  "1024", "--micro-batch-size", "8", "--global-batch-size", "8", "--train-iters", "2",
                                  "--attention-dropout", "0", "--hidden-dropout", "0"};
    a.insert(a.end(), extra.begin(), extra.end());
    // The allocator's statistics exist once CUDA is initialised in this process (ctest runs this
    // test alone: resetting them first throws "Invalid device argument").
    (void)torch::zeros({1}, torch::kCUDA);
    torch::cuda::synchronize();
    c10::cuda::CUDACachingAllocator::emptyCache();
    c10::cuda::CUDACachingAllocator::resetPeakStats(0);
    train_small_gpu_run(a);
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(0);
    return double(stats.allocated_bytes[0].peak) / double(1 << 20);
  };
  const double none = peak({});
  const double full = peak({"--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"});
  const double selective = peak({"--recompute-activations", "--recompute-modules", "core_attn", "mlp"});
  std::printf("[recompute-memory] peak MiB: none %.0f, full uniform 1 %.0f (%.2fx), selective core_attn+mlp %.0f (%.2fx)\n",
              none, full, full / none, selective, selective / none);
  EXPECT_LT(full, 0.65 * none);
  EXPECT_LT(selective, none);
}

// The fused kernels' blocks (flash / memory-efficient / cuDNN, as ATen picks them) merged by
// log-sum-exp equal causal SDPA over the whole sequence, gradients included: the last half of
// the queries against the first half of the keys (full block) and the second half (causal block),
// as a context-parallel rank computes them.
TEST(ContextParallelGpu, KernelBlocksMergeToWholeAttention) {
  REQUIRE_GPU();
  torch::manual_seed(0);
  const auto opts = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kBFloat16);
  const int64_t b = 2, h = 8, hk = 2, s = 256, d = 64, half = s / 2;
  const auto q = torch::randn({b, h, s, d}, opts), k = torch::randn({b, hk, s, d}, opts), v = torch::randn({b, hk, s, d}, opts);
  const auto dout = torch::randn({b, h, half, d}, opts);
  const double scale = 1 / std::sqrt(double(d));
  auto qr = q.clone().requires_grad_(), kr = k.clone().requires_grad_(), vr = v.clone().requires_grad_();
  auto full = at::scaled_dot_product_attention(qr, kr.repeat_interleave(h / hk, 1), vr.repeat_interleave(h / hk, 1), {}, 0.0,
                                               /*is_causal=*/true, scale);
  full.narrow(2, half, half).backward(dout);

  const auto q2 = q.narrow(2, half, half).contiguous();
  const auto k1 = k.narrow(2, 0, half).contiguous(), v1 = v.narrow(2, 0, half).contiguous();
  const auto k2 = k.narrow(2, half, half).contiguous(), v2 = v.narrow(2, half, half).contiguous();
  const AttentionKernel kernel = choose_attention_kernel(q2, k1, 0.0, true);
  std::printf("[cp-blocks] kernel: %s\n", attention_kernel_name(kernel));
  EXPECT_NE(kernel, AttentionKernel::Math);
  const AttentionBlockOptions whole{false, 0.0, scale, choose_attention_kernel(q2, k1, 0.0, false)}, diag{true, 0.0, scale, kernel};
  const auto a = attention_block_forward(q2, k1, v1, whole), c = attention_block_forward(q2, k2, v2, diag);
  auto out = torch::zeros({b, h, half, d}, opts.dtype(torch::kFloat32));
  auto lse = torch::full({b, h, half}, -INFINITY, opts.dtype(torch::kFloat32));
  merge_attention_block(out, lse, a.out, a.lse);
  merge_attention_block(out, lse, c.out, c.lse);
  const auto ref = full.narrow(2, half, half).detach().to(torch::kFloat32);
  const double out_err = (out - ref).abs().max().item<double>();
  const auto o = out.to(torch::kBFloat16);
  const auto ga = attention_block_backward(dout, q2, k1, v1, o, lse, a.state, whole);
  const auto gc = attention_block_backward(dout, q2, k2, v2, o, lse, c.state, diag);
  auto err = [](const torch::Tensor& x, const torch::Tensor& y) {
    return ((x.to(torch::kFloat32) - y.to(torch::kFloat32)).abs().max() / y.to(torch::kFloat32).abs().max()).item<double>();
  };
  const double dq_err = err(ga.dq + gc.dq, qr.grad().narrow(2, half, half));
  // The reference backpropagates from these query rows only: every key's gradient is theirs.
  const double dk_err = err(torch::cat({ga.dk, gc.dk}, 2), kr.grad()), dv_err = err(torch::cat({ga.dv, gc.dv}, 2), vr.grad());
  std::printf("[cp-blocks] max |out - sdpa| %.3g, dq %.3g, dk %.3g, dv %.3g (relative to max)\n", out_err, dq_err, dk_err, dv_err);
  EXPECT_LT(out_err, 2e-2);
  EXPECT_LT(dq_err, 2e-2);
  EXPECT_LT(dk_err, 2e-2);
  EXPECT_LT(dv_err, 2e-2);
}

}  // namespace
}  // namespace fp8tron
