// Context parallelism's single-process pieces: the load-balanced split, the ring schedule, and the
// block attention whose log-sum-exp merge and per-block backward the ring and all-gather attention
// are built from. (The layouts themselves run under mpirun: tests/CMakeLists.txt, parallel.cp*.)
#include <gtest/gtest.h>

#include <cmath>

#include "models/attention/attention_block.h"
#include "models/attention/context_parallel_attention.h"
#include "parallel/context_parallel.h"
#include "tests/test_helpers.h"

namespace fp8tron {
namespace {

TEST(ContextParallel, LoadBalancedSplitPairsEarlyAndLateChunks) {
  const auto x = torch::arange(16);
  // CP 2: chunks of 4; rank 0 holds chunks 0 and 3, rank 1 chunks 1 and 2.
  EXPECT_TRUE(torch::equal(cp_shard(x, 0, 2, 0), torch::tensor({0, 1, 2, 3, 12, 13, 14, 15}, torch::kInt64)));
  EXPECT_TRUE(torch::equal(cp_shard(x, 0, 2, 1), torch::tensor({4, 5, 6, 7, 8, 9, 10, 11}, torch::kInt64)));
  EXPECT_TRUE(torch::equal(cp_positions(16, 2, 1), cp_shard(x, 0, 2, 1)));
  for (int size : {2, 4}) {
    std::vector<torch::Tensor> parts;
    for (int r = 0; r < size; ++r) parts.push_back(cp_shard(x, 0, size, r));
    EXPECT_TRUE(torch::equal(cp_unshard(parts, 0), x)) << size;
  }
  EXPECT_ANY_THROW(cp_shard(torch::arange(12), 0, 4, 0));
}

TEST(ContextParallel, RingStepsGiveEveryRankTheSameWork) {
  // Step 0: the local causal block. Later steps: from an earlier rank, all local queries against
  // the arriving first chunk; from a later rank, the local second chunk against both chunks.
  const int n = 4;
  for (int r = 0; r < n; ++r) {
    const RingStep first = ring_step(r, n, 0);
    EXPECT_TRUE(first.causal && first.all_queries && !first.first_kv_chunk);
    for (int step = 1; step < n; ++step) {
      const RingStep s = ring_step(r, n, step);
      const int src = (r - step + n) % n;
      EXPECT_FALSE(s.causal);
      EXPECT_EQ(s.all_queries, src < r);
      EXPECT_EQ(s.first_kv_chunk, src < r);
    }
  }
}

// Causal attention over 8 keys computed as two blocks (keys 0..3 whole, keys 4..7 causal for the
// last 4 queries) and merged by log-sum-exp equals the direct softmax, gradients included.
TEST(ContextParallel, MergedBlocksEqualWholeAttentionWithGradients) {
  torch::manual_seed(0);
  const int64_t b = 1, h = 4, hk = 2, s = 8, d = 8;
  auto q = torch::randn({b, h, s, d}, torch::kFloat64), k = torch::randn({b, hk, s, d}, torch::kFloat64);
  auto v = torch::randn({b, hk, s, d}, torch::kFloat64), dout = torch::randn({b, h, s, d}, torch::kFloat64);
  const double scale = 1 / std::sqrt(double(d));
  // Reference: autograd through the plain computation, queries 4..7 only (the rows with two blocks).
  auto qr = q.clone().requires_grad_(), kr = k.clone().requires_grad_(), vr = v.clone().requires_grad_();
  auto ke = kr.repeat_interleave(h / hk, 1), ve = vr.repeat_interleave(h / hk, 1);
  auto scores = torch::matmul(qr.narrow(2, 4, 4), ke.transpose(-2, -1)) * scale;
  auto mask = torch::ones({4, 8}, torch::kBool).triu(5);
  auto ref = torch::matmul(scores.masked_fill(mask, -INFINITY).softmax(-1), ve);
  ref.backward(dout.narrow(2, 4, 4));

  const auto q2 = q.narrow(2, 4, 4);
  AttentionBlockOptions full{false, 0, scale, AttentionKernel::Math}, diag{true, 0, scale, AttentionKernel::Math};
  const auto a = attention_block_forward(q2, k.narrow(2, 0, 4), v.narrow(2, 0, 4), full);
  const auto c = attention_block_forward(q2, k.narrow(2, 4, 4), v.narrow(2, 4, 4), diag);
  auto out = torch::zeros({b, h, 4, d}, torch::kFloat32);
  auto lse = torch::full({b, h, 4}, -INFINITY, torch::kFloat32);
  merge_attention_block(out, lse, a.out, a.lse);
  merge_attention_block(out, lse, c.out, c.lse);
  EXPECT_TRUE(torch::allclose(out.to(torch::kFloat64), ref.detach(), 1e-5, 1e-5));

  const auto o = out.to(torch::kFloat64), g = dout.narrow(2, 4, 4);
  const auto ga = attention_block_backward(g, q2, k.narrow(2, 0, 4), v.narrow(2, 0, 4), o, lse, a.state, full);
  const auto gc = attention_block_backward(g, q2, k.narrow(2, 4, 4), v.narrow(2, 4, 4), o, lse, c.state, diag);
  EXPECT_TRUE(torch::allclose(ga.dq + gc.dq, qr.grad().narrow(2, 4, 4), 1e-5, 1e-5));
  EXPECT_TRUE(torch::allclose(torch::cat({ga.dk, gc.dk}, 2), kr.grad(), 1e-5, 1e-5));
  EXPECT_TRUE(torch::allclose(torch::cat({ga.dv, gc.dv}, 2), vr.grad(), 1e-5, 1e-5));
}

// Multi-latent attention's values are narrower than its queries and keys: the ring carries keys
// and values as one message of both head sizes, and the result (and its gradients) equal plain
// causal attention. One rank: the causal block of step 0 (the layouts run under mpirun).
TEST(ContextParallel, RingAttentionTakesValuesOfAnotherHeadSize) {
  torch::manual_seed(1);
  const int64_t b = 2, h = 4, hk = 2, s = 8, d = 12, dv = 6;
  auto q = torch::randn({b, h, s, d}, torch::kFloat64).requires_grad_();
  auto k = torch::randn({b, hk, s, d}, torch::kFloat64).requires_grad_();
  auto v = torch::randn({b, hk, s, dv}, torch::kFloat64).requires_grad_();
  const auto dout = torch::randn({b, h, s, dv}, torch::kFloat64);
  const double scale = 0.3;
  auto ring = make_self_communicator("cp", 0);
  auto out = ring_attention(q, k, v, *ring, 0, scale);
  ASSERT_EQ(out.sizes(), (std::vector<int64_t>{b, h, s, dv}));
  auto grads = torch::autograd::grad({out}, {q, k, v}, {dout});
  auto ke = k.repeat_interleave(h / hk, 1), ve = v.repeat_interleave(h / hk, 1);
  auto scores = (torch::matmul(q, ke.transpose(-2, -1)) * scale).masked_fill(torch::ones({s, s}, torch::kBool).triu(1), -INFINITY);
  auto ref = torch::matmul(scores.softmax(-1), ve);
  auto ref_grads = torch::autograd::grad({ref}, {q, k, v}, {dout});
  EXPECT_TRUE(torch::allclose(out, ref, 1e-5, 1e-5));
  for (size_t i = 0; i < 3; ++i) EXPECT_TRUE(torch::allclose(grads[i], ref_grads[i], 1e-5, 1e-5)) << i;
}

// With --tp-comm-overlap each tensor-parallel rank multiplies its share of its context-parallel
// rank's shard: 32 tokens / CP 2 x micro-batch 1 / TP 2 = 8, not an FP8 GEMM operand (16 without
// counting CP). Flags of context parallelism without it are warned about as inert, and the
// distributed optimizer shards over data x context parallel (not inert with DP 1, CP 2).
TEST(ContextParallel, OverlapChecksCountTheShardAndInertFlagsKnowContextParallelism) {
  auto args = [](std::vector<std::string> extra) {
    std::vector<std::string> a = testing::tiny_args();
    for (size_t i = 0; i + 1 < a.size(); ++i) {
      if (a[i] == "--seq-length") a[i + 1] = "32";
      if (a[i] == "--micro-batch-size") a[i + 1] = "1";
    }
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  };
  EXPECT_USER_ERROR(testing::build(args({"--context-parallel-size", "2", "--tensor-model-parallel-size", "2",
                                         "--sequence-parallel", "--tp-comm-overlap", "--fp8-format", "hybrid"}),
                                   4),
                    "each rank's 8 tokens (--seq-length / --context-parallel-size x --micro-batch-size");
  auto has = [](const Config& c, const std::string& text) {
    for (const auto& w : c.hint_warnings)
      if (w.find(text) != std::string::npos) return true;
    return false;
  };
  EXPECT_TRUE(has(testing::build(args({"--cp-comm-type", "a2a"})),
                  "--cp-comm-type has no effect without --context-parallel-size > 1"));
  EXPECT_FALSE(has(testing::build(args({"--context-parallel-size", "2", "--use-distributed-optimizer"}), 2),
                   "nothing to shard"));
  EXPECT_TRUE(has(testing::build(args({"--use-distributed-optimizer"})), "nothing to shard"));
}

}  // namespace
}  // namespace fp8tron
