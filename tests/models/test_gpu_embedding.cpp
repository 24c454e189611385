// GPU tests of the word embedding's lookup whose backward sums into the fp32 main gradient
// (models/embedding/embedding.h, models/embedding/embedding_grad_kernels.cu): against fp64 sums of the gradient rows,
// repeatable bit for bit, over the first write and accumulation, and torch's path where it does not
// apply (label gpu; skipped without a CUDA device).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "models/embedding/embedding.h"
#include "models/linear/main_grads.h"

namespace fp8tron {
namespace {

#define REQUIRE_GPU() \
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device"

const auto kCuda = torch::TensorOptions().device(torch::kCUDA);
constexpr int64_t kVocab = 1200;

// Token ids, [s, b] transposed as the model looks them up (a non-contiguous view). Random ids from 5
// up, with one frequent enough to span many 32-lookup chunks, ids repeated a few times and ids
// never seen; and ids 0 to 4, which sort first, in a fixed pattern of runs: 32 (one whole chunk),
// 64 (two whole chunks), 33 (a chunk and one more lookup), 1 and 1.
torch::Tensor token_ids(int64_t lookups) {
  torch::manual_seed(3);
  const auto longs = kCuda.dtype(torch::kLong);
  auto ids = torch::randint(5, kVocab, {lookups}, longs);
  ids = torch::where(torch::rand({lookups}, kCuda) < 0.2, torch::randint(100, 105, {lookups}, longs), ids);
  ids = torch::where(torch::rand({lookups}, kCuda) < 0.3, torch::full({lookups}, 7, longs), ids);
  std::vector<int64_t> pattern;
  for (const auto& [id, count] : std::vector<std::pair<int64_t, int>>{{0, 32}, {1, 64}, {2, 33}, {3, 1}, {4, 1}})
    pattern.insert(pattern.end(), count, id);
  const int64_t fixed = std::min<int64_t>(lookups, int64_t(pattern.size()));
  ids.narrow(0, 0, fixed).copy_(torch::tensor(pattern, torch::kLong).narrow(0, 0, fixed));
  return lookups % 2 == 0 ? ids.view({2, lookups / 2}).t() : ids.view({1, lookups}).t();
}

// The fp64 sum of each token's gradient rows: [vocab, hidden].
torch::Tensor exact_grad(const torch::Tensor& ids, const torch::Tensor& grad) {
  const int64_t hidden = grad.size(-1);
  return torch::zeros({kVocab, hidden}, kCuda.dtype(torch::kFloat64))
      .index_add_(0, ids.reshape({-1}), grad.reshape({-1, hidden}).to(torch::kFloat64));
}

// Backpropagates sum(lookup * c) through embedding_lookup on `weight`, under a model's settings
// (fusion on by default).
void run(const torch::Tensor& ids, const torch::Tensor& weight, const torch::Tensor& c,
         const MainGradsPtr& main_grads = make_main_grads()) {
  (embedding_lookup(ids, weight, main_grads).to(torch::kFloat32) * c).sum().backward();
}

TEST(GpuEmbedding, SumsEachTokensRowsIntoTheMainGradient) {
  REQUIRE_GPU();
  for (const auto dtype : {torch::kBFloat16, torch::kFloat32, torch::kFloat16}) {
    for (const int64_t hidden : {768, 100}) {
      for (const int64_t lookups : {4096, 1001, 1}) {  // a whole number of chunks, a partial last chunk, one lookup
        SCOPED_TRACE(std::string(c10::toString(dtype)) + " hidden " + std::to_string(hidden) + " lookups " +
                     std::to_string(lookups));
        const auto ids = token_ids(lookups);
        const auto c = torch::randn({ids.size(0), ids.size(1), hidden}, kCuda);
        const auto weight_values = (torch::randn({kVocab, hidden}, kCuda) * 0.02).to(dtype);
        // The gradient of the lookup, as it reaches the backward: c rounded to the weight's dtype.
        const auto exact = exact_grad(ids, c.to(dtype));
        const auto seen = exact_grad(ids, torch::ones_like(c)).select(1, 0) > 0;  // [vocab]
        const double tolerance = 1e-5 * std::max(1.0, exact.abs().max().item<double>());
        const auto max_error = [&](const torch::Tensor& got) { return (got.to(torch::kFloat64) - exact).abs().max().item<double>(); };

        // torch's path: no main gradient.
        auto plain = weight_values.clone().requires_grad_(true);
        run(ids, plain, c);
        const auto torch_grad = at::embedding_backward(c.to(dtype), ids, kVocab, -1, false, false);
        EXPECT_TRUE(torch::equal(plain.grad(), torch_grad)) << "without a main gradient";

        // Into a main gradient: added to, the same bits on a second run, rows never looked up untouched.
        auto weight = weight_values.clone().requires_grad_(true);
        weight.mutable_grad() = torch::ones({kVocab, hidden}, kCuda.dtype(torch::kFloat32));
        run(ids, weight, c);
        const auto added = weight.grad().clone();
        EXPECT_LE(max_error(added - 1.0), tolerance) << "added";
        EXPECT_TRUE(torch::equal(added.index({~seen}), torch::ones_like(added.index({~seen})))) << "an unseen row changed";
        weight.grad().fill_(1.0);
        run(ids, weight, c);
        EXPECT_TRUE(torch::equal(weight.grad(), added)) << "not repeatable";

        // The step's first write: the stale values are not read.
        const auto first_writes = make_main_grads();
        first_writes->own({weight});
        first_writes->new_step();
        weight.grad().fill_(1e30);
        run(ids, weight, c, first_writes);
        EXPECT_LE(max_error(weight.grad()), tolerance) << "first write";
        EXPECT_EQ(weight.grad().index({~seen}).count_nonzero().item<int64_t>(), 0) << "an unseen row is not zero";

        // Fusion off (--no-gradient-accumulation-fusion): torch's gradient, added by autograd.
        weight.grad().fill_(1.0);
        run(ids, weight, c, make_main_grads(/*gradient_accumulation_fusion=*/false));
        EXPECT_TRUE(torch::equal(weight.grad(), 1.0 + torch_grad.to(torch::kFloat32))) << "fusion off";
      }
    }
  }
}

}  // namespace
}  // namespace fp8tron
