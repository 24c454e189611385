// GPU test of the fused rotary embedding (models/attention/rotary_kernels.cu) against the chain of tensor ops
// it replaces (label gpu; skipped without a CUDA device, failing on any mismatch).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "models/attention/rotary.h"

namespace fp8tron {
namespace {

struct RotaryCase {
  const char* name;
  torch::Dtype dtype;
  RotaryLayout layout;
  bool partial;    // rotate half of each head's channels (--rotary-percent 0.5)
  bool yarn;       // YaRN frequencies and a concentration factor != 1
  bool positions;  // a context-parallel shard's positions
  int64_t per_group;
};

// Largest |a - b| / (tolerance scale) over the tensors: fp32 within 1e-5 of the fp32 chain; bf16 one
// rounding of the same fp32 value (within one bf16 unit in the last place, 2^-7 relative).
double worst_excess(const torch::Tensor& fused, const torch::Tensor& reference, torch::Dtype dtype) {
  const double rel = dtype == torch::kFloat32 ? 1e-5 : 1.0 / 128;
  auto excess = (fused.to(torch::kFloat64) - reference.to(torch::kFloat64)).abs() -
                (reference.to(torch::kFloat64).abs() * rel + 1e-6);
  return excess.max().item<double>();
}

TEST(GpuKernels, FusedRotaryMatchesTheUnfusedChainForwardAndBackward) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const RotaryCase cases[] = {
      {"rotate-half fp32, grouped query view", torch::kFloat32, RotaryLayout::RotateHalf, false, false, false, 4},
      {"rotate-half bf16, grouped query view", torch::kBFloat16, RotaryLayout::RotateHalf, false, false, false, 4},
      {"rotate-half bf16, half the channels", torch::kBFloat16, RotaryLayout::RotateHalf, true, false, false, 1},
      {"interleaved fp32, half the channels", torch::kFloat32, RotaryLayout::Interleaved, true, false, false, 2},
      {"interleaved bf16", torch::kBFloat16, RotaryLayout::Interleaved, false, false, false, 1},
      {"YaRN fp16 with CP positions", torch::kFloat16, RotaryLayout::RotateHalf, false, true, true, 2},
  };
  const int64_t s = 96, b = 3, groups = 2, d = 64;
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    RotarySpec spec;
    spec.dim = c.partial ? d / 2 : d;
    spec.layout = c.layout;
    if (c.yarn) {
      spec.scaling = RotaryScaling::Yarn;
      spec.yarn.scaling_factor = 4.0;
      spec.yarn.original_max_position_embeddings = 64;
      spec.yarn.mscale = 1.0;
      spec.yarn.mscale_all_dim = 0.5;
    }
    // Positions of a context-parallel shard: two chunks from both ends of a longer sequence.
    torch::Tensor positions;
    if (c.positions) positions = torch::cat({torch::arange(0, s / 2), torch::arange(3 * s / 2, 2 * s)});
    RotarySpec unfused_spec = spec;
    unfused_spec.fused = false;
    const RotaryEmbedding fused(spec, positions), unfused(unfused_spec, positions);

    torch::manual_seed(7);
    const auto opts = torch::TensorOptions().device(torch::kCUDA);
    // A fused QKV projection's output: the query part is a strided [s, b, groups, per_group, d] view.
    auto qkv = torch::randn({s, b, groups, c.per_group + 2, d}, opts).to(c.dtype);
    // The upstream gradient reaches the fused op rounded to its dtype: the reference takes the same.
    auto upstream = torch::randn({s, b, groups * c.per_group, d}, opts).to(c.dtype).to(torch::kFloat32);

    auto fused_in = qkv.clone().requires_grad_(true);
    auto out = fused.apply(fused_in.split_with_sizes({c.per_group, 1, 1}, 3)[0]);
    ASSERT_EQ(out.sizes(), upstream.sizes());
    ASSERT_TRUE(out.is_contiguous());
    (out.to(torch::kFloat32) * upstream).sum().backward();

    // The chain in fp32 on the same (rounded) inputs: the fused kernel computes in fp32 and rounds once.
    auto ref_in = qkv.to(torch::kFloat32).requires_grad_(true);
    auto ref = unfused.apply(ref_in.split_with_sizes({c.per_group, 1, 1}, 3)[0]);
    (ref * upstream).sum().backward();

    EXPECT_LE(worst_excess(out, ref, c.dtype), 0.0) << "forward";
    EXPECT_LE(worst_excess(fused_in.grad(), ref_in.grad(), c.dtype), 0.0) << "backward";
    // The rotation really happened (the channels moved), and keys/values got no gradient.
    EXPECT_GT((out.to(torch::kFloat32) - qkv.narrow(3, 0, c.per_group).reshape(out.sizes()).to(torch::kFloat32)).abs().max().item<float>(), 0.1);
    EXPECT_EQ(fused_in.grad().narrow(3, c.per_group, 2).abs().max().item<float>(), 0.0f);
  }
}

}  // namespace
}  // namespace fp8tron
