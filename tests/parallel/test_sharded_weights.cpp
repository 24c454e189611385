// Megatron-FSDP's optim_grads_params weights (parallel/sharded_weights.h) and gradients
// (parallel/sharded_grads.h) in one process: a GPT model's weights held as units hold no memory
// between uses, are gathered for each part's forward and backward pass and released after each, and
// the model computes what it computes with resident weights (bitwise where the BLAS allows); its
// gradients exist only around each unit's backward pass and sum into the shard. (One rank: a
// gather is a copy from the shard, a reduction a copy into it; the collectives across ranks are
// covered by the parallel.*fsdp* layouts.)
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <regex>
#include <string>

#include "fp8/forward_replay.h"
#include "models/gpt_model.h"
#include "parallel/parallel_state.h"
#include "parallel/sharded_grads.h"
#include "parallel/sharded_weights.h"
#include "tests/test_helpers.h"

namespace fp8tron {
namespace {
using namespace fp8tron::testing;

// A transformer layer, else the parameter's own module (as the trainer groups them).
std::string unit_key(const std::string& name) {
  static const std::regex layer(R"(^(.*\blayers\.[0-9]+)\.)");
  std::smatch m;
  return std::regex_search(name, m, layer) ? m[1].str() : name.substr(0, name.rfind('.'));
}

bool holds_memory(const torch::Tensor& p) { return p.storage().nbytes() > 0; }

// The sharded model's result against the resident one's. Bitwise on most CPUs; where the BLAS
// picks its kernel by the operands' addresses (seen on AVX-512 machines, depending on what the
// allocator handed out before), the units' buffers, elsewhere than the reference's weights, round
// some GEMMs differently: then within 1e-5 relative. A weight gathered wrong, or a gradient lost,
// is far outside that.
void expect_same_computation(const torch::Tensor& ours, const torch::Tensor& reference, const std::string& what) {
  if (torch::equal(ours, reference)) return;
  const double scale = reference.abs().max().item<double>();
  const double worst = (ours - reference).abs().max().item<double>();
  EXPECT_LE(worst, 1e-5 * std::max(scale, 1e-30)) << what << ": differs by " << worst << " (largest value " << scale << ")";
}

// A GPT model whose weights are sharded-weight units (one rank: its shard is all of the flat
// buffer, in model order), and the same model with resident weights as the reference.
struct ShardedGpt {
  explicit ShardedGpt(GatherPolicy policy, std::vector<std::string> flags = {})
      : config(build(with(tiny_args({"--num-layers", "6", "--attention-dropout", "0", "--hidden-dropout", "0"}), flags))
                   .model),
        reference(config),
        model(config) {
    torch::manual_seed(5);
    tokens = torch::randint(config.vocab_size, {2, 16}, torch::kLong);
    labels = torch::randint(config.vocab_size, {2, 16}, torch::kLong);
    std::map<std::string, std::vector<BufferParam>> by_unit;
    std::vector<std::string> order;
    int64_t offset = 0;
    for (const auto& item : model->named_parameters()) {
      const BufferParam p{item.value(), offset, item.value().numel(), int64_t(params.size())};
      params.push_back(p);
      const std::string key = unit_key(item.key());
      if (!by_unit.count(key)) order.push_back(key);
      by_unit[key].push_back(p);
      offset += p.numel;
    }
    auto shard = torch::empty({offset});
    for (const auto& p : params) shard.narrow(0, p.offset, p.numel).copy_(p.tensor.detach().reshape({-1}));
    weights = std::make_unique<ShardedWeights>(shard, make_self_communicator("sharded-weights-test", 0), policy);
    for (const auto& key : order) weights->add_unit(by_unit[key]);
    unit_params.reserve(order.size());
    for (const auto& key : order) unit_params.push_back(by_unit[key]);
    num_units = order.size();
    numel = offset;
  }
  torch::Tensor loss(GptModel& m) { return m->loss(tokens, labels, torch::ones({2, 16})); }

  ModelConfig config;
  GptModel reference, model;
  torch::Tensor tokens, labels;
  std::vector<BufferParam> params;
  std::unique_ptr<ShardedWeights> weights;
  std::vector<std::vector<BufferParam>> unit_params;  // in forward order, as the units
  size_t num_units = 0;
  int64_t numel = 0;
};

TEST(ShardedWeights, WeightsAreFreedBetweenUses) {
  ShardedGpt gpt(GatherPolicy{/*prefetch=*/true});
  auto& model = gpt.model;
  auto& reference = gpt.reference;
  auto& weights = *gpt.weights;
  const auto& params = gpt.params;
  auto expected = gpt.loss(reference);
  expected.backward();
  EXPECT_EQ(weights.num_units(), gpt.num_units);
  EXPECT_EQ(weights.total_bytes(), gpt.numel * 4);

  // Between uses no weight holds memory.
  EXPECT_EQ(weights.resident_bytes(), 0);
  for (const auto& p : params) EXPECT_FALSE(holds_memory(p.tensor));

  int64_t forward_peak = 0;
  model->set_params_ready_hook([&](const torch::nn::Module& part) {
    weights.gather_for(part);
    for (const auto& p : part.parameters()) EXPECT_TRUE(holds_memory(p));
    forward_peak = std::max(forward_peak, weights.resident_bytes());
  });
  model->set_params_used_hook([&](const torch::nn::Module& part, const std::vector<torch::Tensor>& outputs) {
    weights.release_for(part, outputs);
  });
  auto loss = gpt.loss(model);
  // After the forward pass every unit is released again (the last prefetch included).
  EXPECT_EQ(weights.resident_bytes(), 0);
  loss.backward();
  // The backward pass gathered each unit again and released it once its gradients had arrived.
  EXPECT_EQ(weights.resident_bytes(), 0);
  for (const auto& p : params) EXPECT_FALSE(holds_memory(p.tensor));
  EXPECT_GT(forward_peak, 0);
  EXPECT_LT(weights.peak_resident_bytes(), weights.total_bytes() / 2) << "at most a few units at a time";

  expect_same_computation(loss, expected, "loss");
  const auto expected_params = reference->named_parameters();
  for (const auto& item : model->named_parameters()) {
    ASSERT_TRUE(item.value().grad().defined()) << item.key();
    expect_same_computation(item.value().grad(), expected_params[item.key()].grad(), item.key());
  }
  // The weights are back as they were when gathered all at once.
  weights.gather_all();
  for (const auto& item : model->named_parameters())
    EXPECT_TRUE(torch::equal(item.value(), expected_params[item.key()])) << item.key();
  weights.release_all();
  EXPECT_EQ(weights.resident_bytes(), 0);
}

// --torch-fsdp2-no-reshard-after-forward: each unit stays gathered from its forward pass until its
// backward pass has its gradients (no gather in the backward pass), and computes the same.
TEST(ShardedWeights, KeptFromForwardToBackward) {
  ShardedGpt gpt(GatherPolicy{/*prefetch=*/false, /*keep_after_forward=*/true});
  auto& weights = *gpt.weights;
  auto expected = gpt.loss(gpt.reference);
  expected.backward();
  gpt.model->set_params_ready_hook([&](const torch::nn::Module& part) { weights.gather_for(part); });
  gpt.model->set_params_used_hook([&](const torch::nn::Module& part, const std::vector<torch::Tensor>& outputs) {
    weights.release_for(part, outputs);
  });
  auto loss = gpt.loss(gpt.model);
  EXPECT_EQ(weights.resident_bytes(), weights.total_bytes()) << "every unit kept for the backward pass";
  const int64_t peak = weights.peak_resident_bytes();
  loss.backward();
  EXPECT_EQ(weights.peak_resident_bytes(), peak) << "nothing gathered again in the backward pass";
  EXPECT_EQ(weights.resident_bytes(), 0) << "each unit released once its gradients arrived";
  expect_same_computation(loss, expected, "loss");
  const auto expected_params = gpt.reference->named_parameters();
  for (const auto& item : gpt.model->named_parameters())
    expect_same_computation(item.value().grad(), expected_params[item.key()].grad(), item.key());
}

// Full recomputation: a layer's replay in the backward pass gathers its unit, which then stays
// gathered for that layer's backward pass, as Megatron-FSDP keeps it: the step gathers each unit
// twice, as without recomputation (three times for a recomputed layer if the replay released it),
// the replay prefetches nothing (the next layer in forward order is done), and the model computes
// exactly what it computes with resident weights.
TEST(ShardedWeights, RecomputedLayerKeepsItsWeightsForItsBackward) {
  const std::vector<std::string> recompute = {"--recompute-granularity", "full", "--recompute-method", "uniform",
                                              "--recompute-num-layers", "1"};
  auto run = [](ShardedGpt& gpt) {
    auto& weights = *gpt.weights;
    gpt.model->set_params_ready_hook([&](const torch::nn::Module& part) { weights.gather_for(part); });
    gpt.model->set_params_used_hook([&](const torch::nn::Module& part, const std::vector<torch::Tensor>& outputs) {
      weights.release_for(part, outputs);
    });
    auto expected = gpt.loss(gpt.reference);
    expected.backward();
    auto loss = gpt.loss(gpt.model);
    loss.backward();
    expect_same_computation(loss, expected, "loss");
    const auto expected_params = gpt.reference->named_parameters();
    for (const auto& item : gpt.model->named_parameters())
      expect_same_computation(item.value().grad(), expected_params[item.key()].grad(), item.key());
    EXPECT_EQ(weights.resident_bytes(), 0) << "every unit released after the backward pass";
    EXPECT_LT(weights.peak_resident_bytes(), weights.total_bytes() / 2) << "at most a few units at a time";
    return weights.gathers();
  };
  for (bool prefetch : {false, true}) {
    SCOPED_TRACE(prefetch ? "with prefetching" : "without prefetching");
    ShardedGpt plain(GatherPolicy{prefetch});
    const int64_t without_recompute = run(plain);
    GatherPolicy policy{prefetch};
    policy.replaying = fp8::forward_replay_active;
    ShardedGpt recomputed(policy, recompute);
    EXPECT_EQ(run(recomputed), without_recompute) << "recomputation gathers no unit a third time";
  }
}

// --fp8-param-gather: once the optimizer publishes codes, the leading (byte-published) weights are
// gathered as their codes and decoded, the rest as values; before that, everything as values.
struct TwoWeights : torch::nn::Module {
  torch::Tensor a = register_parameter("a", torch::zeros({2, 3}));
  torch::Tensor b = register_parameter("b", torch::zeros({4}));
  torch::Tensor bias = register_parameter("bias", torch::zeros({3}));
};

TEST(ShardedWeights, ByteWeightsAreGatheredAsCodesAndDecoded) {
  torch::NoGradGuard no_grad;
  TwoWeights module;
  const std::vector<BufferParam> params = {{module.a, 0, 6, 0}, {module.b, 6, 4, 1}, {module.bias, 10, 3, 2}};
  const auto shard = torch::arange(13, torch::kFloat32);
  ShardedWeights weights(shard, make_self_communicator("sharded-weights-bytes-test", 0), GatherPolicy{},
                         /*byte_numel=*/10);
  weights.add_unit(params);
  weights.gather_for(module);  // before publish_bytes: values
  EXPECT_TRUE(torch::equal(module.a.reshape({-1}), shard.narrow(0, 0, 6)));
  weights.release_all();

  const auto codes = torch::arange(100, 113, torch::kInt32).to(torch::kUInt8);
  std::vector<std::tuple<std::vector<uint8_t>, int64_t, int64_t>> decoded;
  weights.publish_bytes(codes, [&](const torch::Tensor& c, int64_t offset, int64_t numel) {
    decoded.emplace_back(std::vector<uint8_t>(c.data_ptr<uint8_t>(), c.data_ptr<uint8_t>() + c.numel()), offset, numel);
    module.a.reshape({-1}).copy_(c.narrow(0, 0, 6).to(torch::kFloat32) * 2);
    module.b.copy_(c.narrow(0, 6, 4).to(torch::kFloat32) * 2);
  });
  weights.gather_for(module);
  ASSERT_EQ(decoded.size(), 1u);
  const std::vector<uint8_t> expected_codes = {100, 101, 102, 103, 104, 105, 106, 107, 108, 109};
  EXPECT_EQ(std::get<0>(decoded[0]), expected_codes);
  EXPECT_EQ(std::get<1>(decoded[0]), 0);
  EXPECT_EQ(std::get<2>(decoded[0]), 10);
  EXPECT_TRUE(torch::equal(module.b, torch::tensor({212.f, 214.f, 216.f, 218.f})));
  EXPECT_TRUE(torch::equal(module.bias, shard.narrow(0, 10, 3)));  // not byte-published: values
  weights.gather_for(module);  // already gathered: not decoded again
  EXPECT_EQ(decoded.size(), 1u);
  weights.release_all();
  weights.gather_all();  // gathered again: decoded again
  EXPECT_EQ(decoded.size(), 2u);
}

// An output projection's bias left to the next layer's norm kernel (ResidualStream::branch_bias, a
// GPU path) comes out of its layer as the parameter itself: that layer's unit stays gathered until
// the next module's forward pass has read it, then is released.
TEST(ShardedWeights, UnitWhoseParameterIsAnOutputIsReleasedAfterTheNextModule) {
  torch::NoGradGuard no_grad;
  TwoWeights first, second;
  const std::vector<BufferParam> first_params = {{first.a, 0, 6, 0}, {first.b, 6, 4, 1}, {first.bias, 10, 3, 2}};
  const std::vector<BufferParam> second_params = {{second.a, 13, 6, 3}, {second.b, 19, 4, 4}, {second.bias, 23, 3, 5}};
  const auto shard = torch::arange(26, torch::kFloat32);
  ShardedWeights weights(shard, make_self_communicator("sharded-weights-deferred-test", 0), GatherPolicy{});
  weights.add_unit(first_params);
  weights.add_unit(second_params);

  weights.gather_for(first);
  weights.release_for(first, {first.a.sum(), first.bias});
  EXPECT_TRUE(weights.resident(0)) << "the bias is read by the next module";
  weights.gather_for(second);
  EXPECT_TRUE(torch::equal(first.bias, shard.narrow(0, 10, 3)));
  weights.release_for(second, {second.a.sum()});
  EXPECT_FALSE(weights.resident(0));
  EXPECT_FALSE(weights.resident(1));
  EXPECT_EQ(weights.resident_bytes(), 0);

  weights.gather_for(first);
  weights.release_for(first, {first.a.sum()});  // no parameter among the outputs: released at once
  EXPECT_FALSE(weights.resident(0));
  weights.gather_for(second);
  weights.release_for(second, {second.bias});
  weights.release_all();  // a step's end drops what waits for a next module
  EXPECT_EQ(weights.resident_bytes(), 0);
  weights.gather_for(second);
  weights.gather_for(first);
  weights.release_for(first, {first.a.sum()});
  EXPECT_TRUE(weights.resident(1)) << "no release left over from before release_all";
}

}  // namespace
}  // namespace fp8tron

namespace fp8tron {
namespace {

// The gradients of `gpt`'s units sharded too (one rank: its shard is the whole flat buffer).
// `kept`: the units whose gradients stay whole for the step.
std::unique_ptr<ShardedGrads> shard_grads(ShardedGpt& gpt, const std::vector<bool>& kept = {}) {
  auto grads = std::make_unique<ShardedGrads>(torch::zeros({gpt.numel}), torch::kFloat32,
                                              make_self_communicator("sharded-grads-test", 0), nullptr);
  for (size_t u = 0; u < gpt.unit_params.size(); ++u) grads->add_unit(gpt.unit_params[u], u < kept.size() && kept[u]);
  ShardedGrads* g = grads.get();
  gpt.weights->follow_backward([g](size_t unit) { g->prepare(unit); }, [g](size_t unit) { g->reduce(unit); });
  gpt.model->set_params_ready_hook([&gpt](const torch::nn::Module& part) { gpt.weights->gather_for(part); });
  gpt.model->set_params_used_hook([&gpt](const torch::nn::Module& part, const std::vector<torch::Tensor>& outputs) {
    gpt.weights->release_for(part, outputs);
  });
  return grads;
}

// Two micro-batches: each unit's gradient buffer exists from its backward pass until its reduction
// has landed in the shard, which then holds the two micro-batches' sum (bit for bit what autograd
// accumulates in resident gradients: 0 + g1, then + g2).
TEST(ShardedGrads, GradientsExistOnlyAroundEachUnitsBackwardAndSumIntoTheShard) {
  ShardedGpt gpt(GatherPolicy{});
  auto grads = shard_grads(gpt);
  EXPECT_EQ(grads->total_bytes(), gpt.numel * 4);
  EXPECT_EQ(grads->resident_bytes(), 0);
  for (const auto& p : gpt.params) EXPECT_FALSE(holds_memory(p.tensor.grad()));
  for (int micro = 0; micro < 2; ++micro) {
    gpt.loss(gpt.reference).backward();
    gpt.loss(gpt.model).backward();
    // At most the unit whose reduction is still in flight holds memory between backward passes.
    EXPECT_LE(grads->resident_bytes(), grads->total_bytes() / 2);
  }
  grads->finish();
  EXPECT_EQ(grads->resident_bytes(), 0);
  for (const auto& p : gpt.params) EXPECT_FALSE(holds_memory(p.tensor.grad()));
  EXPECT_LT(grads->peak_resident_bytes(), grads->total_bytes() / 2) << "a few units at a time";
  const auto expected = gpt.reference->named_parameters();
  size_t i = 0;
  for (const auto& item : gpt.model->named_parameters()) {
    const BufferParam& p = gpt.params[i++];
    const auto reduced = grads->shard().narrow(0, p.offset, p.numel).view(item.value().sizes());
    EXPECT_TRUE(torch::equal(reduced, expected[item.key()].grad())) << item.key();
  }
  // A new step starts from zero.
  grads->zero();
  EXPECT_EQ(grads->shard().abs().sum().item<float>(), 0.0f);
}

// optim_grads (GatherPolicy::keep_gathered): each unit is gathered at its first use and stays
// gathered through both micro-batches' passes (one gather per unit and step), while its gradients
// still exist only around its backward passes and sum into the shard as under ZeRO-3.
TEST(ShardedGrads, KeptGatheredWeightsStillShardTheGradients) {
  GatherPolicy policy;
  policy.keep_gathered = true;
  ShardedGpt gpt(policy);
  auto grads = shard_grads(gpt);
  for (int micro = 0; micro < 2; ++micro) {
    gpt.loss(gpt.reference).backward();
    gpt.loss(gpt.model).backward();
    EXPECT_EQ(gpt.weights->resident_bytes(), gpt.weights->total_bytes()) << "the weights stay whole";
    EXPECT_LE(grads->resident_bytes(), grads->total_bytes() / 2);
  }
  EXPECT_EQ(gpt.weights->gathers(), int64_t(gpt.num_units)) << "each unit gathered once";
  grads->finish();
  EXPECT_LT(grads->peak_resident_bytes(), grads->total_bytes() / 2) << "a few units' gradients at a time";
  const auto expected = gpt.reference->named_parameters();
  size_t i = 0;
  for (const auto& item : gpt.model->named_parameters()) {
    const BufferParam& p = gpt.params[i++];
    EXPECT_TRUE(torch::equal(grads->shard().narrow(0, p.offset, p.numel).view(item.value().sizes()),
                             expected[item.key()].grad()))
        << item.key();
  }
  // The step's new weights: every unit released, gathered again at its next use.
  gpt.weights->release_all();
  EXPECT_EQ(gpt.weights->resident_bytes(), 0);
}

// A kept unit (the tied embedding on a pipeline's first stage) keeps its gradients for the whole
// step, for another group to sum before finish() reduces it.
TEST(ShardedGrads, KeptUnitHoldsItsGradientsUntilTheStepEnds) {
  ShardedGpt gpt(GatherPolicy{});
  auto grads = shard_grads(gpt, {true});  // the first unit: the word embedding
  const torch::Tensor embedding = gpt.unit_params.front().front().tensor;
  gpt.loss(gpt.reference).backward();
  gpt.loss(gpt.model).backward();
  ASSERT_TRUE(holds_memory(embedding.grad()));
  const auto before = embedding.grad().clone();
  bool summed_before_kept = false;
  grads->finish([&] {
    summed_before_kept = holds_memory(embedding.grad());
    embedding.grad().mul_(2);  // another group's sum
  });
  EXPECT_TRUE(summed_before_kept);
  const BufferParam& p = gpt.unit_params.front().front();
  EXPECT_TRUE(torch::equal(grads->shard().narrow(0, p.offset, p.numel).view(before.sizes()), before * 2));
  EXPECT_TRUE(torch::equal(before, gpt.reference->named_parameters()[
      std::string(gpt.model->named_parameters().begin()->key())].grad()));
  grads->zero();
  EXPECT_TRUE(holds_memory(embedding.grad()));
  EXPECT_EQ(embedding.grad().abs().sum().item<float>(), 0.0f);
}


// A bias a part leaves to the next part's kernel (the GPU's fused residual-add + norm) gets its
// gradient in that next part's backward pass, before its own unit's pass prepares the buffer: a
// kernel writing it asks for the buffer first (MainGrads' allocate-on-write calls prepare_for), and
// a gradient autograd delivers prepares its unit through the accumulator's hook.
TEST(ShardedGrads, GradientFromALaterPartFindsItsBuffer) {
  TwoWeights first, second;
  const std::vector<BufferParam> first_params = {{first.a, 0, 6, 0}, {first.b, 6, 4, 1}, {first.bias, 10, 3, 2}};
  const std::vector<BufferParam> second_params = {{second.a, 13, 6, 3}, {second.b, 19, 4, 4}, {second.bias, 23, 3, 5}};
  const auto comm = make_self_communicator("sharded-grads-later-part-test", 0);
  {
    torch::NoGradGuard no_grad;
    for (auto* m : {&first, &second})
      for (auto& p : m->parameters()) p.copy_(torch::arange(p.numel(), torch::kFloat32).view(p.sizes()));
  }
  ShardedGrads grads(torch::zeros({26}), torch::kFloat32, comm, nullptr);
  grads.add_unit(first_params, false);
  grads.add_unit(second_params, false);
  grads.prepare(1);  // the second part's backward pass (ShardedWeights' hook, not used here)
  const auto y = (first.bias * 2).sum() * (second.a.sum() + second.b.sum() + second.bias.sum());
  bool written = false;
  y.register_hook([&](const torch::Tensor&) {  // the second part's kernel writing first.b's gradient
    grads.prepare_for(first.b);
    written = holds_memory(first.b.grad());
    if (written) first.b.grad().add_(1);
  });
  y.backward();  // first.bias's gradient through autograd, first.a's none
  grads.finish();
  EXPECT_TRUE(written);
  // d y / d first.bias = 2 * (second's sum: 15 + 6 + 3).
  EXPECT_TRUE(torch::equal(grads.shard().narrow(0, 10, 3), torch::full({3}, 48.0f)));
  EXPECT_TRUE(torch::equal(grads.shard().narrow(0, 6, 4), torch::ones({4})));
  EXPECT_TRUE(torch::equal(grads.shard().narrow(0, 0, 6), torch::zeros({6})));
  EXPECT_TRUE(torch::equal(grads.shard().narrow(0, 13, 6), torch::full({6}, 6.0f)));  // 2 * (0 + 1 + 2)
  EXPECT_EQ(grads.resident_bytes(), 0);
}

}  // namespace
}  // namespace fp8tron
