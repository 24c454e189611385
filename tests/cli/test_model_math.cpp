#include <gtest/gtest.h>

#include "tests/test_helpers.h"
#include "trainer/cli/model_math.h"

namespace fp8tron {
using namespace fp8tron::testing;

ModelConfig reference(int64_t layers, int64_t hidden, int64_t heads, int64_t seq) {
  return build(tiny_args({"--num-layers", std::to_string(layers), "--hidden-size", std::to_string(hidden),
                          "--num-attention-heads", std::to_string(heads), "--seq-length", std::to_string(seq),
                          "--vocab-size", "50257"}))
      .model;
}

// The reference models (docs/performance.md): GPT-2 124M has 124.48M parameters and 0.855 GFLOP/token;
// GPT 1.3B 1315.8M and 9.07.
TEST(ModelMath, ReferenceModels) {
  auto small = reference(12, 768, 12, 1024);
  EXPECT_EQ(small.padded_vocab_size, 50304);
  EXPECT_EQ(count_parameters(small).total, 124475904);
  EXPECT_NEAR(training_flops_per_token(small) / 1e9, 0.855, 0.001);
  auto large = reference(24, 2048, 16, 2048);
  EXPECT_NEAR(double(count_parameters(large).total) / 1e6, 1315.8, 0.1);
  EXPECT_NEAR(training_flops_per_token(large) / 1e9, 9.07, 0.01);
}

// The classic formula 72 L H^2 (1 + S/6H + V/12LH) equals Megatron's general one for GPT-2 shapes.
TEST(ModelMath, FlopsMatchClassicFormula) {
  auto m = reference(24, 1024, 16, 2048);
  const double L = 24, H = 1024, S = 2048, V = double(m.padded_vocab_size);
  EXPECT_NEAR(training_flops_per_token(m), 72 * L * H * H * (1 + S / (6 * H) + V / (12 * L * H)), 1.0);
}

TEST(ModelMath, GatedAndGroupedVariants) {
  auto m = build(tiny_args({"--swiglu", "--group-query-attention", "--num-query-groups", "2", "--disable-bias-linear",
                            "--normalization", "RMSNorm", "--untie-embeddings-and-output-weights",
                            "--position-embedding-type", "rope"}))
               .model;
  auto p = count_parameters(m);
  const int64_t h = 32, f = m.ffn_hidden_size, q = 32, kv = 16;
  EXPECT_EQ(p.per_layer, h + h * (q + 2 * kv) + q * h + h + h * 2 * f + f * h);
  EXPECT_EQ(p.embedding, m.padded_vocab_size * h);  // rope: no position table
  EXPECT_EQ(p.output_layer, m.padded_vocab_size * h);
}

// --attention-output-gate widens the QKV projection by one query-sized block: parameters and, as
// Megatron counts them, the projection FLOPs.
TEST(ModelMath, AttentionOutputGateWidensQkv) {
  const std::initializer_list<std::string> base = {"--group-query-attention", "--num-query-groups", "2",
                                                   "--disable-bias-linear"};
  auto plain = build(tiny_args(base)).model;
  auto gated_args = tiny_args(base);
  gated_args.push_back("--attention-output-gate");
  auto gated = build(gated_args).model;
  const int64_t h = 32, q = 32;
  EXPECT_EQ(count_parameters(gated).per_layer - count_parameters(plain).per_layer, h * q);
  const double extra = 6.0 * double(gated.num_layers) * double(h * q);
  EXPECT_NEAR(training_flops_per_token(gated) - training_flops_per_token(plain), extra, 1e-6 * extra);
}

TEST(ModelMath, MemoryEstimateFollowsThePaper) {
  Config c = build(tiny_args({"--num-layers", "24", "--hidden-size", "2048", "--num-attention-heads", "16",
                              "--seq-length", "2048", "--micro-batch-size", "4", "--vocab-size", "50257", "--bf16"}));
  MemoryEstimate e = estimate_memory(c);
  const double params = double(count_parameters(c.model).total);
  EXPECT_DOUBLE_EQ(e.weights, params * 2);
  EXPECT_DOUBLE_EQ(e.main_weights, params * 4);
  EXPECT_DOUBLE_EQ(e.grads, params * 4);
  EXPECT_DOUBLE_EQ(e.optimizer_states, params * 8);
  // s*b*h*(34 + 5*a*s/h) per layer without parallelism.
  const double s = 2048, b = 4, h = 2048, a = 16;
  EXPECT_DOUBLE_EQ(e.activations_paper, 24 * s * b * h * (34 + 5 * a * s / h));
  EXPECT_LT(e.activations_fused, e.activations_paper);
}

TEST(ModelMath, DistributedOptimizerShardsOverItsInstance) {
  // fp32 main weights and Adam's two moments: over DP4 one shard of 4, or of 2 with two
  // distributed-optimizer instances (each holds a whole copy); the weights and gradients stay whole.
  auto dp4 = [](std::initializer_list<std::string> extra) {
    std::vector<std::string> a = tiny_args({"--bf16", "--global-batch-size", "8"});
    a.insert(a.end(), extra.begin(), extra.end());
    return estimate_memory(build(a, 4));
  };
  const MemoryEstimate whole = dp4({});
  const MemoryEstimate sharded = dp4({"--use-distributed-optimizer"});
  const MemoryEstimate instances = dp4({"--use-distributed-optimizer", "--num-distributed-optimizer-instances", "2"});
  EXPECT_DOUBLE_EQ(sharded.optimizer_states, whole.optimizer_states / 4);
  EXPECT_DOUBLE_EQ(sharded.main_weights, whole.main_weights / 4);
  EXPECT_DOUBLE_EQ(instances.optimizer_states, whole.optimizer_states / 2);
  EXPECT_DOUBLE_EQ(instances.main_weights, whole.main_weights / 2);
  EXPECT_DOUBLE_EQ(instances.weights, whole.weights);
  EXPECT_DOUBLE_EQ(instances.grads, whole.grads);
}

// Megatron-FSDP optim_grads_params: the weights between uses are the optimizer's shard, and the
// largest unit gathered around its use (twice with prefetching) comes on top.
TEST(ModelMath, ShardedWeightsMemory) {
  const std::vector<std::string> base = {"--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "4",
                                         "--seq-length", "16", "--micro-batch-size", "1", "--lr", "1e-3",
                                         "--train-iters", "1", "--vocab-size", "1000", "--builtin-data"};
  const MemoryEstimate plain = estimate_memory(build(with(base, {"--use-distributed-optimizer"}), 4));
  const MemoryEstimate sharded = estimate_memory(build(with(base, {"--use-megatron-fsdp"}), 4));
  const MemoryEstimate prefetched = estimate_memory(
      build(with(base, {"--use-megatron-fsdp", "--overlap-grad-reduce", "--overlap-param-gather"}), 4));
  EXPECT_EQ(plain.gathered_weights, 0.0);
  EXPECT_NEAR(sharded.weights, plain.weights / 4, plain.weights * 0.01);
  EXPECT_GT(sharded.gathered_weights, 0.0);
  EXPECT_LT(sharded.weights + sharded.gathered_weights, plain.weights);
  EXPECT_DOUBLE_EQ(prefetched.gathered_weights, 2 * sharded.gathered_weights);
  // The gradients follow the units: about three units' worth (fp32 like the weights here) and the
  // fp32 shard the micro-batches' reductions are summed into.
  EXPECT_DOUBLE_EQ(sharded.grads, 3 * sharded.gathered_weights);
  EXPECT_LT(sharded.grads, plain.grads);
  EXPECT_EQ(plain.grad_shard, 0.0);
  EXPECT_DOUBLE_EQ(sharded.grad_shard, plain.main_weights);  // this rank's shard, in fp32
  EXPECT_DOUBLE_EQ(sharded.total() - sharded.weights - sharded.gathered_weights - sharded.grads - sharded.grad_shard,
                   plain.total() - plain.weights - plain.grads);
  // Before the first step the whole model exists twice: as drawn (fp32) and in the weight buffer.
  EXPECT_DOUBLE_EQ(sharded.startup, plain.startup);
  EXPECT_DOUBLE_EQ(plain.startup, plain.weights * 2 + plain.main_weights);  // fp32 weights
  EXPECT_DOUBLE_EQ(plain.peak(), std::max(plain.total(), plain.startup));
  // optim_grads: the gradients as under optim_grads_params; the weights whole, and the optimizer's
  // shard of them that the units are gathered from.
  const MemoryEstimate grads_only =
      estimate_memory(build(with(base, {"--use-megatron-fsdp", "--data-parallel-sharding-strategy", "optim_grads"}), 4));
  EXPECT_DOUBLE_EQ(grads_only.grads, sharded.grads);
  EXPECT_DOUBLE_EQ(grads_only.grad_shard, sharded.grad_shard);
  EXPECT_EQ(grads_only.gathered_weights, 0.0);
  EXPECT_DOUBLE_EQ(grads_only.weights, plain.weights + sharded.weights);
}

TEST(ModelMath, PrecisionAwareOptimizerStateDtypes) {
  // bf16 moments take 2 bytes each instead of 4; --main-grads-dtype bf16 halves the gradient buffer.
  auto estimate = [](std::initializer_list<std::string> extra) {
    std::vector<std::string> a = tiny_args({"--bf16", "--use-distributed-optimizer", "--use-precision-aware-optimizer"});
    a.insert(a.end(), extra.begin(), extra.end());
    return estimate_memory(build(a));
  };
  const MemoryEstimate fp32 = estimate({});
  const double params = double(count_parameters(build(tiny_args()).model).total);
  EXPECT_DOUBLE_EQ(fp32.optimizer_states, params * 8);
  EXPECT_DOUBLE_EQ(estimate({"--exp-avg-dtype", "bf16"}).optimizer_states, params * 6);
  EXPECT_DOUBLE_EQ(estimate({"--exp-avg-dtype", "bf16", "--exp-avg-sq-dtype", "bf16"}).optimizer_states, params * 4);
  EXPECT_DOUBLE_EQ(estimate({"--exp-avg-dtype", "fp8", "--exp-avg-sq-dtype", "fp16"}).optimizer_states, params * 3);
  // fp16 main weights: 2 bytes each, stored from an fp32 copy at start-up.
  const MemoryEstimate fp16_main = estimate({"--main-params-dtype", "fp16"});
  EXPECT_DOUBLE_EQ(fp32.main_weights, params * 4);
  EXPECT_DOUBLE_EQ(fp16_main.main_weights, params * 2);
  EXPECT_DOUBLE_EQ(fp16_main.startup, fp32.startup + params * 2);
  EXPECT_DOUBLE_EQ(fp32.grads, params * 4);
  EXPECT_DOUBLE_EQ(estimate({"--main-grads-dtype", "bf16"}).grads, params * 2);
  // fp32 gradients are reduced in place; 16-bit ones into an fp32 copy the optimizer steps on.
  EXPECT_EQ(fp32.grad_shard, 0.0);
  EXPECT_DOUBLE_EQ(estimate({"--main-grads-dtype", "bf16"}).grad_shard, params * 4);
}

}  // namespace fp8tron
