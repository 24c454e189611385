// GPU tests of the word embedding's lookup whose backward sums into the fp32 main gradient
// (models/embedding.h, models/embedding_grad_kernels.cu): against fp64 sums of the gradient rows,
// repeatable bit for bit, over the first write and accumulation, and torch's path where it does not
// apply (label gpu; skipped without a CUDA device).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "fp8/wgrad_fusion.h"
#include "models/embedding.h"
#include "models/main_grad_first_write.h"

namespace fp8tron {
namespace {

#define REQUIRE_GPU() \
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device"

const auto kCuda = torch::TensorOptions().device(torch::kCUDA);

// Token ids with every shape of run the kernels distinguish: one id frequent enough to span many
// 32-lookup chunks, ids repeated a few times (runs inside a chunk and across one boundary), ids
// seen once, and ids never seen.
torch::Tensor token_ids(int64_t lookups, int64_t vocab) {
  torch::manual_seed(3);
  const auto longs = kCuda.dtype(torch::kLong);
  auto ids = torch::randint(0, vocab, {lookups}, longs);
  ids = torch::where(torch::rand({lookups}, kCuda) < 0.2, torch::randint(100, 105, {lookups}, longs), ids);  // a few times
  ids = torch::where(torch::rand({lookups}, kCuda) < 0.3, torch::full({lookups}, 7, longs), ids);  // frequent
  return ids.view({lookups / 4, 4});  // [s, b] as the model looks them up
}

// The fp64 sum of each token's gradient rows: [vocab, hidden].
torch::Tensor exact_grad(const torch::Tensor& ids, const torch::Tensor& grad, int64_t vocab) {
  const int64_t hidden = grad.size(-1);
  return torch::zeros({vocab, hidden}, kCuda.dtype(torch::kFloat64))
      .index_add_(0, ids.reshape({-1}), grad.reshape({-1, hidden}).to(torch::kFloat64));
}

// Backpropagates sum(lookup * c) through embedding_lookup on `weight`.
void run(const torch::Tensor& ids, const torch::Tensor& weight, const torch::Tensor& c) {
  (embedding_lookup(ids, weight).to(torch::kFloat32) * c).sum().backward();
}

TEST(GpuEmbedding, SumsEachTokensRowsIntoTheMainGradient) {
  REQUIRE_GPU();
  struct Restore {
    ~Restore() { main_grad_first_write::own({}); }
  } restore;
  for (const auto dtype : {torch::kBFloat16, torch::kFloat32}) {
    for (const int64_t hidden : {768, 100}) {
      for (const int64_t lookups : {4096, 1000}) {  // a whole number of chunks, and not
        const int64_t vocab = 1200;
        SCOPED_TRACE(std::string(c10::toString(dtype)) + " hidden " + std::to_string(hidden) + " lookups " +
                     std::to_string(lookups));
        const auto ids = token_ids(lookups, vocab);
        const auto c = torch::randn({lookups / 4, 4, hidden}, kCuda);
        const auto weight_values = (torch::randn({vocab, hidden}, kCuda) * 0.02).to(dtype);
        // The gradient of the lookup, as it reaches the backward: c rounded to the weight's dtype.
        const auto exact = exact_grad(ids, c.to(dtype), vocab);

        // torch's path: no main gradient.
        auto plain = weight_values.clone().requires_grad_(true);
        run(ids, plain, c);
        const auto torch_grad = at::embedding_backward(c.to(dtype), ids, vocab, -1, false, false);
        EXPECT_TRUE(torch::equal(plain.grad(), torch_grad)) << "without a main gradient";

        // Into a main gradient: added to, the same bits on a second run.
        auto weight = weight_values.clone().requires_grad_(true);
        weight.mutable_grad() = torch::ones({vocab, hidden}, kCuda.dtype(torch::kFloat32));
        run(ids, weight, c);
        const auto added = weight.grad().clone();
        const double scale = exact.abs().max().item<double>();
        EXPECT_LE(((added.to(torch::kFloat64) - 1.0) - exact).abs().max().item<double>(), 1e-5 * scale) << "added";
        weight.grad().fill_(1.0);
        run(ids, weight, c);
        EXPECT_TRUE(torch::equal(weight.grad(), added)) << "not repeatable";

        // The step's first write: the stale values are not read.
        main_grad_first_write::own({weight});
        main_grad_first_write::new_step();
        weight.grad().fill_(1e30);
        run(ids, weight, c);
        EXPECT_LE((weight.grad().to(torch::kFloat64) - exact).abs().max().item<double>(), 1e-5 * scale) << "first write";
        main_grad_first_write::own({});

        // Fusion off (--no-gradient-accumulation-fusion): torch's gradient, added by autograd.
        set_gradient_accumulation_fusion(false);
        weight.grad().fill_(1.0);
        run(ids, weight, c);
        set_gradient_accumulation_fusion(true);
        EXPECT_TRUE(torch::equal(weight.grad(), 1.0 + torch_grad.to(torch::kFloat32))) << "fusion off";
      }
    }
  }
}

}  // namespace
}  // namespace fp8tron
