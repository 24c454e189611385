// GPU tests of the optimizer's fused AdamW (optim/fused_adamw.h) against torch's
// at::_fused_adamw_, which the optimizer used before (label gpu; skipped without a CUDA device,
// failing on any mismatch). The kernel spells out torch's roundings, so every comparison is
// bitwise: p, m and v against torch's on the same inputs, the model copy against p.to(dtype), and
// whole optimizer steps (segments, decoupled learning rates, folded clipping, skipped steps, the
// distributed optimizer's shards, bf16 moments) against the same optimizer running torch's kernel.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "parallel/parallel_state.h"
#include "optim/fused_adamw.h"
#include "optim/mixed_precision_optimizer.h"
#include "tests/optim/lone_data_parallel_rank.h"
#include "tests/optim/scaled_state_reference.h"
#include "tests/optim/same_bits.h"

namespace fp8tron {
namespace {

#define REQUIRE_GPU() \
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device"

const auto kCuda = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kFloat32);

// Bit patterns equal (so -0 != +0, and NaNs compare by payload).
// A fresh buffer holding `n` elements from element `offset` on (earlier ones are a guard).
torch::Tensor at_offset(const torch::Tensor& values, int64_t offset, torch::ScalarType dtype = torch::kFloat32) {
  auto buffer = torch::full({offset + values.numel() + 3}, -7.0, kCuda.dtype(dtype));
  auto view = buffer.narrow(0, offset, values.numel());
  view.copy_(values);
  return view;
}

// Gradients with the scales a step sees: mostly small, a few large, some exact zeros and tiny ones.
torch::Tensor gradients(int64_t n, int seed) {
  torch::manual_seed(seed);
  auto g = torch::randn({n}, kCuda) * 1e-3;
  g = torch::where(torch::rand({n}, kCuda) < 0.01, g * 1e4, g);
  g = torch::where(torch::rand({n}, kCuda) < 0.01, torch::zeros_like(g), g);
  return torch::where(torch::rand({n}, kCuda) < 0.01, g * 1e-30, g);  // subnormal squares
}

struct KernelCase {
  int64_t n;
  int64_t p_offset, g_offset, copy_offset;  // elements into their buffers (m, v share p's)
  torch::ScalarType copy_dtype;             // kByte: no copy
  const char* why;
};

struct Hyper {
  double lr, beta1, beta2, eps;
};

// Three steps of ours and torch's on equal inputs, with and without weight decay and a gradient
// divisor, then a skipped step (found_inf = 1).
void check_against_torch(const KernelCase& c, const Hyper& h, double wd, bool divide) {
  torch::manual_seed(11);
  const auto p0 = torch::randn({c.n}, kCuda);
  auto p = at_offset(p0, c.p_offset), m = at_offset(torch::zeros({c.n}, kCuda), c.p_offset),
       v = at_offset(torch::zeros({c.n}, kCuda), c.p_offset);
  auto tp = p0.clone(), tm = torch::zeros({c.n}, kCuda), tv = torch::zeros({c.n}, kCuda);
  torch::Tensor copy;
  if (c.copy_dtype != torch::kByte) copy = at_offset(torch::zeros({c.n}, kCuda), c.copy_offset, c.copy_dtype);
  auto step = torch::zeros({}, kCuda), tstep = torch::zeros({}, kCuda);
  const auto no_inf = torch::zeros({}, kCuda);
  // A clip coefficient's reciprocal, as the optimizer folds clipping.
  const std::optional<torch::Tensor> divisor =
      divide ? std::optional<torch::Tensor>(torch::full({}, 0.37, kCuda).reciprocal()) : std::nullopt;
  for (int s = 1; s <= 3; ++s) {
    SCOPED_TRACE("step " + std::to_string(s));
    const auto g_values = gradients(c.n, 100 + s);
    auto g = at_offset(g_values, c.g_offset);
    auto tg = g_values.clone();
    step.add_(1);
    tstep.add_(1);
    fused_adamw({p, g, m, v, copy}, step, no_inf, divisor, {h.lr, h.beta1, h.beta2, h.eps, wd});
    at::_fused_adamw_({tp}, {tg}, {tm}, {tv}, {}, {tstep}, h.lr, h.beta1, h.beta2, wd, h.eps, false, false, divisor, no_inf);
    EXPECT_TRUE(same_bits(p, tp)) << "p";
    EXPECT_TRUE(same_bits(m, tm)) << "exp_avg";
    EXPECT_TRUE(same_bits(v, tv)) << "exp_avg_sq";
    EXPECT_TRUE(same_bits(g, g_values)) << "the gradient is read only";
    if (copy.defined()) {
      EXPECT_TRUE(same_bits(copy, p.to(c.copy_dtype))) << "model copy";
    }
  }
  // Nothing outside the segments moved (each buffer's guard elements before and after).
  for (const auto& t : {p, m, v}) {
    auto whole = t.as_strided({c.p_offset + c.n + 3}, {1}, t.storage_offset() - c.p_offset);
    EXPECT_EQ((whole.narrow(0, 0, c.p_offset) != -7).sum().item<int64_t>(), 0) << "before the segment";
    EXPECT_EQ((whole.narrow(0, c.p_offset + c.n, 3) != -7).sum().item<int64_t>(), 0) << "after the segment";
  }
  // A skipped step: the caller does not advance the count, and nothing changes (the copy neither).
  const auto found_inf = torch::ones({}, kCuda);
  const auto p_before = p.clone(), m_before = m.clone(), v_before = v.clone();
  if (copy.defined()) copy.fill_(3.0);
  auto g = at_offset(gradients(c.n, 200), c.g_offset);
  fused_adamw({p, g, m, v, copy}, step, found_inf, divisor, {h.lr, h.beta1, h.beta2, h.eps, wd});
  EXPECT_TRUE(same_bits(p, p_before));
  EXPECT_TRUE(same_bits(m, m_before));
  EXPECT_TRUE(same_bits(v, v_before));
  if (copy.defined()) {
    EXPECT_EQ((copy.to(torch::kFloat32) != 3.0).sum().item<int64_t>(), 0) << "copy written on a skipped step";
  }
}

TEST(GpuAdamW, MatchesTorchFusedAdamWBitwise) {
  REQUIRE_GPU();
  const std::vector<KernelCase> cases = {
      {1, 0, 0, 0, torch::kBFloat16, "one element"},
      {3, 0, 0, 0, torch::kBFloat16, "three: no whole pack"},
      {1000003, 0, 0, 0, torch::kBFloat16, "aligned, odd tail"},
      {1000003, 1, 1, 1, torch::kBFloat16, "a narrow from element 1: head of 3"},
      {1000003, 2, 2, 6, torch::kFloat16, "head of 2, fp16 copy"},
      {1000003, 3, 3, 7, torch::kFloat32, "head of 1, fp32 copy"},
      {1000003, 1, 1, 0, torch::kBFloat16, "copy out of phase with p: element stores"},
      {1000003, 0, 1, 0, torch::kBFloat16, "g out of phase with p: everything element by element"},
      {4096 * 4 + 5, 2, 2, 2, torch::kByte, "no copy"},
  };
  const std::vector<Hyper> hypers = {{1e-3, 0.9, 0.95, 1e-8}, {3e-4, 0.8, 0.999, 1e-5}};
  for (const auto& c : cases)
    for (const auto& h : hypers)
      for (double wd : {0.0, 0.1})
        for (bool divide : {false, true}) {
          SCOPED_TRACE(std::string(c.why) + " n=" + std::to_string(c.n) + " lr=" + std::to_string(h.lr) +
                       " wd=" + std::to_string(wd) + (divide ? " with divisor" : ""));
          check_against_torch(c, h, wd, divide);
        }
}

// bf16 moments (the precision-aware optimizer): the kernel widens them, steps in fp32 and rounds
// them back to nearest-even as it stores them; the CPU path (optim/optimizer_domain.cpp) runs torch's
// kernel on fp32 copies and rounds them. Bitwise the same p, m and v, at every alignment of the bf16
// buffers (8-byte packs, or one by one when m or v is out of phase with p).
TEST(GpuAdamW, Bf16MomentsMatchTheCpuPathBitwise) {
  REQUIRE_GPU();
  struct Case {
    int64_t n, p_offset, m_offset, v_offset;
    const char* why;
  };
  const std::vector<Case> cases = {{3, 0, 0, 0, "no whole pack"},
                                   {100003, 0, 0, 0, "aligned"},
                                   {100003, 1, 1, 1, "head of 3"},
                                   {100003, 0, 2, 0, "m out of phase: element by element"},
                                   {100003, 0, 0, 1, "v out of phase: element by element"}};
  const Hyper h{1e-3, 0.9, 0.95, 1e-8};
  for (const auto& c : cases) {
    SCOPED_TRACE(std::string(c.why) + " n=" + std::to_string(c.n));
    torch::manual_seed(13);
    const auto p0 = torch::randn({c.n}, kCuda);
    auto p = at_offset(p0, c.p_offset);
    auto m = at_offset(torch::zeros({c.n}, kCuda), c.m_offset, torch::kBFloat16);
    auto v = at_offset(torch::zeros({c.n}, kCuda), c.v_offset, torch::kBFloat16);
    auto copy = at_offset(torch::zeros({c.n}, kCuda), c.p_offset, torch::kBFloat16);
    auto tp = p0.clone(), tm = torch::zeros({c.n}, kCuda.dtype(torch::kBFloat16)), tv = tm.clone();
    auto step = torch::zeros({}, kCuda), tstep = torch::zeros({}, kCuda);
    const auto no_inf = torch::zeros({}, kCuda);
    for (int s = 1; s <= 4; ++s) {
      SCOPED_TRACE("step " + std::to_string(s));
      const auto g_values = gradients(c.n, 400 + s);
      auto g = at_offset(g_values, c.p_offset);
      step.add_(1);
      tstep.add_(1);
      fused_adamw({p, g, m, v, copy}, step, no_inf, std::nullopt, {h.lr, h.beta1, h.beta2, h.eps, 0.1});
      auto tm32 = tm.to(torch::kFloat32), tv32 = tv.to(torch::kFloat32);
      at::_fused_adamw_({tp}, {g_values.clone()}, {tm32}, {tv32}, {}, {tstep}, h.lr, h.beta1, h.beta2, 0.1, h.eps, false,
                        false, std::nullopt, no_inf);
      tm.copy_(tm32);
      tv.copy_(tv32);
      EXPECT_TRUE(same_bits(p, tp)) << "p";
      EXPECT_TRUE(same_bits(m, tm)) << "exp_avg";
      EXPECT_TRUE(same_bits(v, tv)) << "exp_avg_sq";
      EXPECT_TRUE(same_bits(copy, p.to(torch::kBFloat16))) << "model copy";
    }
  }
}

// More than 2^31 elements: 64-bit indexing. Torch's kernel runs on copies of three slices
// (the start, across 2^31, the end); elementwise, so the slices' results are the whole's.
TEST(GpuAdamW, MoreThanTwoToThe31Elements) {
  REQUIRE_GPU();
  const int64_t n = (int64_t{1} << 31) + 4099;
  size_t free_bytes = 0, total_bytes = 0;
  ASSERT_EQ(cudaMemGetInfo(&free_bytes, &total_bytes), cudaSuccess);
  if (double(free_bytes) < 48e9) GTEST_SKIP() << "needs 48 GB of free device memory, has " << free_bytes;
  torch::manual_seed(5);
  auto p = torch::randn({n}, kCuda), g = torch::randn({n}, kCuda).mul_(1e-2), m = torch::randn({n}, kCuda).mul_(1e-3),
       v = torch::rand({n}, kCuda).mul_(1e-5);
  auto copy = torch::empty({n}, kCuda.dtype(torch::kBFloat16));
  auto step = torch::full({}, 7.0, kCuda);
  const auto no_inf = torch::zeros({}, kCuda);
  const Hyper h{1e-3, 0.9, 0.95, 1e-8};
  struct Slice {
    int64_t at, len;
  };
  const std::vector<Slice> slices = {{0, 4096}, {(int64_t{1} << 31) - 2050, 4100}, {n - 4099, 4099}};
  std::vector<std::vector<torch::Tensor>> expected;
  for (const auto& s : slices) {
    std::vector<torch::Tensor> t;
    for (const auto& x : {p, g, m, v}) t.push_back(x.narrow(0, s.at, s.len).clone());
    auto tstep = step.clone();
    at::_fused_adamw_({t[0]}, {t[1]}, {t[2]}, {t[3]}, {}, {tstep}, h.lr, h.beta1, h.beta2, 0.1, h.eps, false, false,
                      std::nullopt, no_inf);
    expected.push_back(t);
  }
  fused_adamw({p, g, m, v, copy}, step, no_inf, std::nullopt, {h.lr, h.beta1, h.beta2, h.eps, 0.1});
  for (size_t i = 0; i < slices.size(); ++i) {
    SCOPED_TRACE("slice at " + std::to_string(slices[i].at));
    const auto& s = slices[i];
    EXPECT_TRUE(same_bits(p.narrow(0, s.at, s.len), expected[i][0]));
    EXPECT_TRUE(same_bits(m.narrow(0, s.at, s.len), expected[i][2]));
    EXPECT_TRUE(same_bits(v.narrow(0, s.at, s.len), expected[i][3]));
    EXPECT_TRUE(same_bits(copy.narrow(0, s.at, s.len), expected[i][0].to(torch::kBFloat16)));
  }
}

// ---- whole optimizer steps: the fused kernel against torch's kernel and the separate copy ----

struct ParamSpec {
  std::string name;
  std::vector<int64_t> shape;
};

// Segments of every kind Megatron's groups make: decayed weights, undecayed biases and norms, the
// embedding and output layer with --decoupled-lr. Odd sizes put segment starts off 16-byte
// boundaries.
const std::vector<ParamSpec> kParams = {
    {"embedding.word_embeddings.weight", {37, 16}},
    {"decoder.layers.0.self_attention.linear_qkv.weight", {48, 16}},
    {"decoder.layers.0.self_attention.linear_qkv.bias", {48}},
    {"decoder.layers.0.mlp.linear_fc1.weight", {33, 16}},
    {"decoder.layers.0.mlp.linear_fc1.bias", {33}},
    {"decoder.layers.0.mlp.linear_fc2.weight", {16, 33}},
    {"decoder.final_layernorm.weight", {16}},
    {"output_layer.weight", {37, 16}},
};

std::vector<NamedParam> make_params(torch::ScalarType dtype) {
  torch::manual_seed(21);
  std::vector<NamedParam> params;
  for (const auto& spec : kParams)
    params.push_back({spec.name, (torch::randn(spec.shape, kCuda) * 0.05).to(dtype).requires_grad_(true), ParamInfo{}});
  return params;
}

struct Layout {
  ParamDtype dtype;
  int dp_rank;  // -1: one process, no distributed optimizer
  const char* why;
  StateDtype moments = StateDtype::Fp32;  // the precision-aware optimizer's --exp-avg(-sq)-dtype
  StateDtype main = StateDtype::Fp32;     // its --main-params-dtype
  std::optional<StateDtype> second;       // its --exp-avg-sq-dtype, where it differs from `moments`
};

torch::ScalarType torch_dtype(ParamDtype d) {
  return d == ParamDtype::Bf16 ? torch::kBFloat16 : d == ParamDtype::Fp16 ? torch::kFloat16 : torch::kFloat32;
}

struct OptimizerRun {
  std::vector<NamedParam> params;
  std::unique_ptr<MixedPrecisionOptimizer> optimizer;
};

OptimizerRun make_run(const Layout& s, bool torch_kernel) {
  OptimizerRun r;
  r.params = make_params(torch_dtype(s.dtype));
  OptimizerConfig oc;
  oc.clip_grad = 0.05;  // below the gradients' norm: the coefficient is folded into the kernel
  oc.adam_beta2 = 0.95;
  oc.decoupled_lr = 3e-3;
  const StateDtype second = s.second.value_or(s.moments);
  if (s.moments != StateDtype::Fp32 || second != StateDtype::Fp32 || s.main != StateDtype::Fp32)
    oc.precision_aware = {true, s.moments, second, s.main};
  PrecisionConfig pc;
  pc.params_dtype = s.dtype;
  ParallelState state = single_process_state();
  if (s.dp_rank >= 0) state.dp = std::make_shared<LoneDataParallelRank>(s.dp_rank);
  r.optimizer = std::make_unique<MixedPrecisionOptimizer>(r.params, oc, pc, state, /*distributed=*/s.dp_rank >= 0);
  for (const auto& d : r.optimizer->domains()) d->use_torch_adam_kernel(torch_kernel);
  return r;
}

void expect_same_state(const OptimizerDomain& a, const OptimizerDomain& b) {
  EXPECT_TRUE(same_bits(a.main_values(), b.main_values())) << "main params";
  EXPECT_TRUE(same_bits(a.main_params_to_save(), b.main_params_to_save())) << "main params as saved";
  EXPECT_TRUE(same_bits(a.exp_avg(), b.exp_avg())) << "exp_avg";
  EXPECT_TRUE(same_bits(a.exp_avg_sq(), b.exp_avg_sq())) << "exp_avg_sq";
  EXPECT_TRUE(same_bits(a.model_params(), b.model_params())) << "model params";
  // Moments scaled per parameter: their scales too (what checkpoints read back).
  EXPECT_TRUE(same_bits(a.moments_to_save().first, b.moments_to_save().first)) << "exp_avg as saved";
  EXPECT_TRUE(same_bits(a.moments_to_save().second, b.moments_to_save().second)) << "exp_avg_sq as saved";
  EXPECT_EQ(a.step_count(), b.step_count());
}

TEST(GpuAdamW, OptimizerStepsMatchTorchKernelAndCopy) {
  REQUIRE_GPU();
  const std::vector<Layout> setups = {
      {ParamDtype::Bf16, -1, "bf16 parameters, one process"},
      {ParamDtype::Fp16, -1, "fp16 parameters, one process"},
      {ParamDtype::Fp32, -1, "fp32 parameters (the main weights themselves), one process"},
      {ParamDtype::Bf16, 0, "bf16, distributed optimizer, rank 0 of 2"},
      {ParamDtype::Bf16, 1, "bf16, distributed optimizer, rank 1 of 2 (shard starts at an odd element)"},
      {ParamDtype::Fp32, 1, "fp32, distributed optimizer, rank 1 of 2"},
      // The torch-kernel side runs bf16 moments through fp32 copies (the CPU path).
      {ParamDtype::Bf16, 1, "bf16 moments, distributed optimizer, rank 1 of 2", StateDtype::Bf16},
      {ParamDtype::Bf16, -1, "bf16 moments, one process", StateDtype::Bf16},
      // Moments scaled per parameter: the fused two-pass kernel against the torch operations.
      {ParamDtype::Bf16, 1, "fp8 moments, distributed optimizer, rank 1 of 2", StateDtype::Fp8},
      {ParamDtype::Bf16, -1, "fp16 moments, one process", StateDtype::Fp16},
      {ParamDtype::Fp16, 0, "fp8 moments, fp16 parameters, rank 0 of 2", StateDtype::Fp8},
      // One scaled moment beside a plain one, and fp16 main weights: the same kernel.
      {ParamDtype::Bf16, 1, "fp8 / bf16 moments, rank 1 of 2", StateDtype::Fp8, StateDtype::Fp32, StateDtype::Bf16},
      {ParamDtype::Bf16, -1, "fp32 / fp16 moments, one process", StateDtype::Fp32, StateDtype::Fp32, StateDtype::Fp16},
      {ParamDtype::Bf16, 1, "fp16 main weights, fp32 moments, rank 1 of 2", StateDtype::Fp32, StateDtype::Fp16},
      {ParamDtype::Bf16, -1, "fp16 main weights, bf16 moments, one process", StateDtype::Bf16, StateDtype::Fp16},
      {ParamDtype::Fp16, 0, "fp16 main weights, fp8 / fp16 moments, fp16 parameters, rank 0 of 2", StateDtype::Fp8,
       StateDtype::Fp16, StateDtype::Fp16},
  };
  for (const auto& s : setups) {
    SCOPED_TRACE(s.why);
    OptimizerRun ours = make_run(s, false), theirs = make_run(s, true);
    const auto& a = *ours.optimizer->domains().front();
    const auto& b = *theirs.optimizer->domains().front();
    if (s.dp_rank == 1) {
      ASSERT_TRUE(a.distributed());
      EXPECT_EQ(a.shard_begin() % 2, 1) << "the test wants a shard start out of phase with 16-byte packs";
    }
    for (int step = 1; step <= 5; ++step) {
      SCOPED_TRACE("step " + std::to_string(step));
      const int64_t n = a.main_grads().numel();
      auto g = gradients(n, 300 + step) * 10;
      // Step 3 is skipped (an inf in this rank's shard): nothing moves.
      if (step == 3) g[a.shard_begin() + 5] = std::numeric_limits<float>::infinity();
      const double loss_scale = step == 4 ? 4.0 : 1.0;                   // a divisor before the norm
      for (OptimizerRun* r : {&ours, &theirs}) {
        r->optimizer->zero_grad();
        auto grads = r->optimizer->domains().front()->main_grads();
        grads.copy_(g.to(grads.scalar_type()));
        r->optimizer->finalize_grads();
      }
      const StepResult ra = ours.optimizer->step(1e-3 * step, 0.1, loss_scale, GroupLrs{/*decoupled=*/2e-3});
      const StepResult rb = theirs.optimizer->step(1e-3 * step, 0.1, loss_scale, GroupLrs{/*decoupled=*/2e-3});
      EXPECT_EQ(ra.found_inf.item<float>(), step == 3 ? 1.0f : 0.0f);
      EXPECT_TRUE(same_bits(ra.grad_norm, rb.grad_norm));
      expect_same_state(a, b);
      // The parameters the model reads are the model buffer's.
      for (size_t i = 0; i < ours.params.size(); ++i) EXPECT_TRUE(same_bits(ours.params[i].tensor, theirs.params[i].tensor));
    }
    EXPECT_EQ(a.step_count(), 4.0) << "the skipped step does not advance bias correction";
    // Publishing again (as a checkpoint load does) changes nothing: the step left them published.
    // (fp16 main weights excepted: the step wrote the model weights before rounding them, so a
    // load reads the model weights too.)
    if (s.main != StateDtype::Fp32) continue;
    auto before = a.model_params().clone();
    ours.optimizer->publish_model_params();
    EXPECT_TRUE(same_bits(a.model_params(), before));
  }
}

// fp16/fp8 moments scaled per parameter (optim/scaled_state.h), stepped by the fused kernel on the
// GPU: a first step gives the fp32 optimizer's main weights bit for bit and stores its moments as
// Transformer Engine's formulas do on the device, one scale per
// parameter (per rank's part of a parameter the shard boundary cuts); a skipped second step
// changes nothing; the fp32 copies a checkpoint holds store back to the same bits.
TEST(GpuAdamW, ScaledMomentsAsTransformerEngineOnTheDevice) {
  REQUIRE_GPU();
  for (int dp_rank : {-1, 1})
    for (StateDtype dtype : {StateDtype::Fp16, StateDtype::Fp8}) {
      SCOPED_TRACE(std::string(dtype == StateDtype::Fp16 ? "fp16" : "fp8") + ", rank " + std::to_string(dp_rank));
      OptimizerRun low = make_run({ParamDtype::Bf16, dp_rank, "scaled", dtype}, false),
                   ref = make_run({ParamDtype::Bf16, dp_rank, "fp32 moments"}, false);
      OptimizerDomain& a = *low.optimizer->domains().front();
      const OptimizerDomain& b = *ref.optimizer->domains().front();
      ASSERT_TRUE(a.exp_avg().is_cuda());
      for (int step = 1; step <= 2; ++step) {
        const auto g = gradients(a.main_grads().numel(), 500 + step) * 10;
        if (step == 2) g[a.shard_begin() + 5] = std::numeric_limits<float>::infinity();
        for (OptimizerRun* r : {&low, &ref}) {
          r->optimizer->zero_grad();
          r->optimizer->domains().front()->main_grads().copy_(g);
          r->optimizer->finalize_grads();
        }
        const auto m = a.exp_avg().clone(), v = a.exp_avg_sq().clone();
        low.optimizer->step(1e-3, 0.1, 1.0);
        ref.optimizer->step(1e-3, 0.1, 1.0);
        EXPECT_TRUE(same_bits(a.main_params(), b.main_params())) << "main params, step " << step;
        EXPECT_TRUE(same_bits(a.model_params(), b.model_params())) << "model params, step " << step;
        if (step == 2) {
          EXPECT_TRUE(same_bits(a.exp_avg(), m) && same_bits(a.exp_avg_sq(), v)) << "the skipped step";
          continue;
        }
        for (const auto& [stored, fp32] : {std::pair{a.exp_avg(), b.exp_avg()}, std::pair{a.exp_avg_sq(), b.exp_avg_sq()}}) {
          const auto mine = per_param(a, stored), theirs = per_param(b, fp32);
          ASSERT_EQ(mine.size(), theirs.size());
          for (size_t i = 0; i < mine.size(); ++i)
            EXPECT_TRUE(same_bits(mine[i].second, te_stored(theirs[i].second, dtype))) << mine[i].first;
        }
      }
      const auto m = a.exp_avg().clone(), v = a.exp_avg_sq().clone();
      const auto [m32, v32] = a.moments_to_save();
      auto [m_in, v_in] = a.moments_to_load();
      m_in.copy_(m32);
      v_in.copy_(v32);
      low.optimizer->adopt_loaded_states();
      EXPECT_TRUE(same_bits(a.exp_avg(), m) && same_bits(a.exp_avg_sq(), v)) << "stored back from fp32 copies";
    }
}

// fp16 main weights (--main-params-dtype fp16), stepped by the fused kernel on the GPU: each step
// is the fp32 optimizer's step of the weights read back from fp16, the model weights its fp32
// result in bf16, and the new weights stored as Transformer Engine's formulas store them on the
// device; a skipped step changes nothing.
TEST(GpuAdamW, Fp16MainWeightsAsTransformerEngineOnTheDevice) {
  REQUIRE_GPU();
  for (int dp_rank : {-1, 1})
    for (StateDtype moments : {StateDtype::Fp32, StateDtype::Fp16}) {
      SCOPED_TRACE(std::string(moments == StateDtype::Fp16 ? "fp16" : "fp32") + " moments, rank " + std::to_string(dp_rank));
      OptimizerRun low = make_run({ParamDtype::Bf16, dp_rank, "fp16 main", moments, StateDtype::Fp16}, false),
                   ref = make_run({ParamDtype::Bf16, dp_rank, "fp32 main", moments}, false);
      OptimizerDomain& a = *low.optimizer->domains().front();
      OptimizerDomain& b = *ref.optimizer->domains().front();
      ASSERT_TRUE(a.main_codes().is_cuda());
      for (int step = 1; step <= 3; ++step) {
        SCOPED_TRACE("step " + std::to_string(step));
        const auto g = gradients(a.main_grads().numel(), 700 + step) * 10;
        if (step == 2) g[a.shard_begin() + 5] = std::numeric_limits<float>::infinity();
        b.main_params().copy_(a.main_values());
        for (OptimizerRun* r : {&low, &ref}) {
          r->optimizer->zero_grad();
          r->optimizer->domains().front()->main_grads().copy_(g);
          r->optimizer->finalize_grads();
        }
        const auto codes = a.main_codes().clone(), model = a.model_params().clone();
        low.optimizer->step(1e-3, 0.1, 1.0);
        ref.optimizer->step(1e-3, 0.1, 1.0);
        if (step == 2) {
          EXPECT_TRUE(same_bits(a.main_codes(), codes) && same_bits(a.model_params(), model)) << "the skipped step";
          continue;
        }
        EXPECT_TRUE(same_bits(a.model_params(), b.model_params())) << "model params";
        EXPECT_TRUE(same_bits(a.exp_avg(), b.exp_avg()) && same_bits(a.exp_avg_sq(), b.exp_avg_sq())) << "moments";
        const auto mine = per_param(a, a.main_codes()), theirs = per_param(b, b.main_params());
        ASSERT_EQ(mine.size(), theirs.size());
        for (size_t i = 0; i < mine.size(); ++i)
          EXPECT_TRUE(same_bits(mine[i].second, te_stored(theirs[i].second, StateDtype::Fp16))) << mine[i].first;
      }
    }
}

}  // namespace
}  // namespace fp8tron
