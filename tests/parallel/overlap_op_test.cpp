// The communicating linear (parallel/overlap/tp_linear.h) under mpirun on CPU, the whole world
// being the tensor-parallel group (run with 2 and with 4 ranks): for every method of every
// direction, in fp32 and FP8 emulated (delayed, tensorwise, blockwise, MXFP8), the output and the
// gradients of x, W and b equal bit for bit those of the plain mappings (gather_from_sp /
// reduce_scatter_to_sp around one F::linear or fp8_linear), over two steps so that delayed scales
// updated from the shards' amaxes are exercised; the FP8 reduce-scatter (fp8_buf) within a
// tolerance. Also the rank-ordered MPI reduce-scatter the bitwise claims rest on, and the
// chunked-GEMM property of the CPU BLAS (a row block or a column block of a product equals the
// product of the blocks), whose failure would otherwise show as many equivalence failures.
// Every rank runs every test in the same order; any rank's failure fails the job.
#include <gtest/gtest.h>

#include <chrono>

#include "fp8/fp8_linear.h"
#include "fp8/recipe.h"
#include "models/linear/linear_kernels_fp8.h"
#include "models/linear/linear_kernels_plain.h"
#include "parallel/overlap/tp_linear.h"
#include "parallel/tensor_parallel.h"

namespace fp8tron {
namespace {

using overlap::TpLinearPlan;
using M = OverlapMethod;
namespace F = torch::nn::functional;

Communicator& tp() {
  static std::shared_ptr<Transport> transport = make_mpi_transport(CommTimeouts{std::chrono::minutes(2), std::chrono::seconds(90)});
  static std::shared_ptr<Communicator> comm = [] {
    std::vector<int> all;
    for (int r = 0; r < transport->world_size(); ++r) all.push_back(r);
    return transport->new_group("tp", {all});
  }();
  return *comm;
}

torch::Tensor random(std::vector<int64_t> shape, uint64_t seed) {
  torch::manual_seed(seed);
  return torch::randn(shape, torch::kFloat32);
}

GemmOverlap how(M method, int splits = 4, bool aggregate = false, bool fp8_wire = false) {
  GemmOverlap g;
  g.method = method;
  g.num_splits = splits;
  g.aggregate = aggregate;
  g.fp8_wire = fp8_wire;
  return g;
}

struct Grads {
  torch::Tensor y, dx, dw, db;
};

// One linear of the test: column- or row-parallel, plain or FP8 with one engine per run (the
// reference and the overlapped run keep their own delayed-scaling state).
struct Case {
  std::string name;
  TpLinearPlan plan;
  fp8::Prologue prologue = fp8::Prologue::kNone;
};

class Harness {
 public:
  Harness(std::optional<fp8::Recipe> recipe, int64_t width) : recipe_(std::move(recipe)), width_(width) {}

  // Trains the same linear twice (reference and overlapped) for two steps and compares.
  void check(const Case& c, double tolerance = 0) {
    const bool column = c.plan.column;
    const int n = tp().size(), r = tp().rank();
    // 16 local rows (8 per CoC piece); 32 with wide operands, whose CPU GEMMs are bitwise in row
    // blocks of at least 16 rows (MKL takes another kernel for fewer rows of a long reduction).
    const int64_t s_local = width_ >= 128 ? 16 : 8, b = 2, k = width_, out = width_;
    auto w0 = random({out, k}, 11 + r), b0 = random({out}, 12 + r);
    Engines ref = engines(c.name + ".ref", out, k), ov = engines(c.name + ".overlap", out, k);
    auto w_ref = w0.clone().requires_grad_(true), w_ov = w0.clone().requires_grad_(true);
    auto bias_ref = column ? b0.clone().requires_grad_(true) : torch::Tensor();
    auto bias_ov = column ? b0.clone().requires_grad_(true) : torch::Tensor();
    if (ref.site) ref.site->parameter = w_ref;
    if (ov.site) ov.site->parameter = w_ov;
    for (int step = 0; step < 2; ++step) {
      const std::vector<int64_t> x_shape = column ? std::vector<int64_t>{s_local, b, k} : std::vector<int64_t>{s_local * n, b, k};
      auto x = random(x_shape, 100 + 10 * step + r);
      const std::vector<int64_t> y_shape = column ? std::vector<int64_t>{s_local * n, b, out} : std::vector<int64_t>{s_local, b, out};
      auto dy = random(y_shape, 200 + 10 * step + r);
      Grads want = run_reference(c, x, dy, w_ref, bias_ref, ref.site.get());
      Grads got = run_overlapped(c, x, dy, w_ov, bias_ov, ov.site.get());
      compare(c.name + " step " + std::to_string(step), want, got, tolerance);
      if (ref.engine) {
        end_step(*ref.engine);
        end_step(*ov.engine);
        if (ref.engine->scale().defined() && tolerance == 0)
          EXPECT_TRUE(torch::equal(ref.engine->scale(), ov.engine->scale()))
              << c.name << ": delayed scales from the shards' amaxes differ from the gathered tensor's";
      }
    }
  }

 private:
  struct Engines {
    std::shared_ptr<fp8::Fp8Engine> engine;
    std::shared_ptr<fp8::Fp8Site> site;
  };
  Engines engines(const std::string& name, int64_t out, int64_t in) {
    if (!recipe_) return {};
    Engines e;
    e.engine = std::make_shared<fp8::Fp8Engine>(fp8::Fp8EngineOptions{*recipe_}, torch::Device(torch::kCPU));
    e.site = e.engine->add_site(name, -1, out, in);
    return e;
  }
  static void end_step(fp8::Fp8Engine& e) {
    e.end_step([](torch::Tensor& amaxes) { tp().all_reduce(amaxes, ReduceOp::Max); });
  }
  static torch::Tensor linear(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b, fp8::Fp8Site* site,
                              fp8::Prologue prologue) {
    if (site) return fp8::fp8_linear(x, w, b, *site, prologue);
    return F::linear(prologue == fp8::Prologue::kGeluTanh ? at::gelu(x, "tanh") : x, w, b);
  }
  Grads run_reference(const Case& c, const torch::Tensor& x0, const torch::Tensor& dy, torch::Tensor& w, torch::Tensor& b,
                      fp8::Fp8Site* site) {
    auto x = x0.clone().requires_grad_(true);
    torch::Tensor y = c.plan.column ? linear(gather_from_sp(x, tp()), w, b, site, c.prologue)
                                    : reduce_scatter_to_sp(linear(x, w, {}, site, c.prologue), tp());
    return finish(x, y, dy, w, b);
  }
  Grads run_overlapped(const Case& c, const torch::Tensor& x0, const torch::Tensor& dy, torch::Tensor& w, torch::Tensor& b,
                       fp8::Fp8Site* site) {
    auto x = x0.clone().requires_grad_(true);
    std::shared_ptr<overlap::LinearKernels> k;
    if (site) k = std::make_shared<Fp8LinearKernels>(w, b, *site, tp(), c.plan, c.prologue);
    else k = std::make_shared<PlainLinearKernels>(w, b);
    torch::Tensor input = !site && c.prologue == fp8::Prologue::kGeluTanh ? at::gelu(x, "tanh") : x;
    auto y = overlap::tp_linear(input, w, b, {}, k, c.plan, tp(), w.size(0));
    return finish(x, y, dy, w, b);
  }
  static Grads finish(torch::Tensor& x, const torch::Tensor& y, const torch::Tensor& dy, torch::Tensor& w, torch::Tensor& b) {
    if (w.grad().defined()) w.mutable_grad().zero_();
    if (b.defined() && b.grad().defined()) b.mutable_grad().zero_();
    y.backward(dy);
    Grads g{y.detach().clone(), x.grad().clone(), w.grad().clone(), b.defined() ? b.grad().clone() : torch::Tensor()};
    return g;
  }
  static void compare(const std::string& what, const Grads& want, const Grads& got, double tolerance) {
    auto same = [&](const char* name, const torch::Tensor& a, const torch::Tensor& b) {
      if (!a.defined() && !b.defined()) return;
      ASSERT_TRUE(a.defined() && b.defined()) << what << " " << name;
      ASSERT_EQ(a.sizes(), b.sizes()) << what << " " << name;
      if (tolerance == 0) {
        EXPECT_TRUE(torch::equal(a, b)) << what << " " << name << ": max difference " << (a - b).abs().max().item<double>();
      } else {
        const double rel = ((a - b).norm() / a.norm().clamp_min(1e-12)).item<double>();
        EXPECT_LE(rel, tolerance) << what << " " << name;
      }
    };
    same("y", want.y, got.y);
    same("dx", want.dx, got.dx);
    same("dW", want.dw, got.dw);
    same("db", want.db, got.db);
  }

  std::optional<fp8::Recipe> recipe_;
  int64_t width_;
};

TpLinearPlan column(GemmOverlap fprop, GemmOverlap dgrad, GemmOverlap wgrad) { return {true, fprop, dgrad, wgrad}; }
TpLinearPlan row(GemmOverlap fprop, GemmOverlap dgrad) { return {false, fprop, dgrad, GemmOverlap{}}; }

// Every method of every direction (the ones a group size allows).
std::vector<Case> cases() {
  const bool four = tp().size() >= 4 && tp().size() % 2 == 0;
  std::vector<Case> c = {
      {"column plain collectives", column(how(M::kOff), how(M::kOff), how(M::kOff))},
      {"column ring + bulk", column(how(M::kRingExchange), how(M::kBulk), how(M::kBulk))},
      {"column CoC pieces", column(how(M::kPipeline, 2), how(M::kOff), how(M::kBulk))},
      {"column ring + rs-dgrad pipeline", column(how(M::kRingExchange), how(M::kPipeline, 2), how(M::kOff))},
      {"column ring + rs-dgrad ring", column(how(M::kRingExchange), how(M::kRingExchange), how(M::kOff))},
      {"row plain collectives", row(how(M::kOff), how(M::kOff))},
      {"row pipeline + dgrad ring", row(how(M::kPipeline, 2), how(M::kRingExchange))},
      {"row ring reduce-scatter", row(how(M::kRingExchange), how(M::kRingExchange))},
      {"row CoC", row(how(M::kPipeline, 2), how(M::kPipeline, 2))},
      {"row GeLU prologue", row(how(M::kPipeline, 2), how(M::kRingExchange)), fp8::Prologue::kGeluTanh},
  };
  if (four) {
    c.push_back({"column aggregated ring", column(how(M::kRingExchange, 4, true), how(M::kBulk), how(M::kBulk))});
    c.push_back({"row aggregated dgrad ring", row(how(M::kOff), how(M::kRingExchange, 4, true))});
  }
  return c;
}

TEST(TpLinear, PlainEqualsTheMappingsBitwise) {
  Harness h(std::nullopt, 32);
  for (const auto& c : cases()) h.check(c);
}

TEST(TpLinear, Fp8DelayedEqualsBitwise) {
  Harness h(fp8::make_recipe(fp8::RecipeKind::kDelayed, fp8::Fp8Format::kHybrid, 0, 1, 4), 32);
  for (const auto& c : cases()) h.check(c);
}

TEST(TpLinear, Fp8TensorwiseEqualsBitwise) {
  Harness h(fp8::make_recipe(fp8::RecipeKind::kTensorwise, fp8::Fp8Format::kHybrid), 32);
  for (const auto& c : cases()) h.check(c);
}

// 128x128 weight blocks: column splits of 128 (width 256, two splits).
TEST(TpLinear, Fp8BlockwiseEqualsBitwise) {
  Harness h(fp8::make_recipe(fp8::RecipeKind::kBlockwise, fp8::Fp8Format::kE4M3), 256);
  for (const auto& c : cases()) h.check(c);
}

TEST(TpLinear, Fp8Mxfp8EqualsBitwise) {
  Harness h(fp8::make_recipe(fp8::RecipeKind::kMxfp8, fp8::Fp8Format::kE4M3), 64);
  for (const auto& c : cases()) h.check(c);
}

// FP8 partials on the wire (fp8_buf): another rounding, so within a tolerance (each partial's
// values rounded to E4M3, 2^-4 relative at worst, and summed: ~3e-2 of the norm).
TEST(TpLinear, Fp8ReduceScatterWithinTolerance) {
  for (auto kind : {fp8::RecipeKind::kDelayed, fp8::RecipeKind::kTensorwise}) {
    Harness h(fp8::make_recipe(kind, fp8::Fp8Format::kHybrid), 32);
    h.check({"row FP8 reduce-scatter", row(how(M::kPipeline, 2, false, true), how(M::kRingExchange))}, 5e-2);
  }
}

// MPI's reduce-scatter sums in rank order whatever the size: the whole equals its pieces'.
TEST(MpiReduceScatter, RankOrderedSum) {
  const int n = tp().size(), r = tp().rank();
  auto in = random({int64_t(n) * 64, 8}, 300 + r);
  auto whole = torch::empty({64, 8});
  tp().reduce_scatter(whole, in);
  auto want = torch::zeros({64, 8});
  for (int s = 0; s < n; ++s) {
    auto piece = random({int64_t(n) * 64, 8}, 300 + s).narrow(0, 64 * r, 64);
    want = s == 0 ? piece.clone() : want.add_(piece);
  }
  EXPECT_TRUE(torch::equal(whole, want));
  for (int part = 0; part < 2; ++part) {
    auto cols = in.narrow(1, 4 * part, 4).contiguous();
    auto out = torch::empty({64, 4});
    tp().reduce_scatter(out, cols);
    EXPECT_TRUE(torch::equal(out, whole.narrow(1, 4 * part, 4)));
  }
  auto bf16 = in.to(torch::kBFloat16);
  auto out16 = torch::empty({64, 8}, torch::kBFloat16);
  tp().reduce_scatter(out16, bf16);  // fp32 sum, one rounding
  auto want16 = torch::zeros({64, 8});
  for (int s = 0; s < n; ++s) want16.add_(random({int64_t(n) * 64, 8}, 300 + s).to(torch::kBFloat16).narrow(0, 64 * r, 64).to(torch::kFloat32));
  EXPECT_TRUE(torch::equal(out16, want16.to(torch::kBFloat16)));
}

// The CPU BLAS property the bitwise equivalence rests on, at the shapes of the tests: blocks of rows
// and blocks of output columns of addmm/mm equal the whole product's. Measured with LibTorch 2.11's
// MKL on one thread: row blocks need at least K/16 rows (fewer rows of a long reduction take another
// kernel: 8 rows of K = 256 differ in the last bit), so the tests keep their chunks above that.
TEST(ChunkedGemm, BlocksEqualTheWholeProduct) {
  if (tp().rank() != 0) return;
  for (int64_t k : {32, 64, 128, 256}) {
    auto x = random({64, k}, 1), w = random({96, k}, 2), b = random({96}, 3), dy = random({64, 96}, 4);
    const auto y = torch::addmm(b, x, w.t()), y0 = torch::mm(x, w.t()), dx = torch::mm(dy, w);
    for (int64_t rows : {8, 16, 32})
      for (int64_t r0 = 0; rows * 16 >= k && r0 < 64; r0 += rows) {
        EXPECT_TRUE(torch::equal(torch::addmm(b, x.narrow(0, r0, rows), w.t()), y.narrow(0, r0, rows))) << k << " " << rows;
        EXPECT_TRUE(torch::equal(torch::mm(x.narrow(0, r0, rows), w.t()), y0.narrow(0, r0, rows))) << k << " " << rows;
        EXPECT_TRUE(torch::equal(torch::mm(dy.narrow(0, r0, rows), w), dx.narrow(0, r0, rows))) << k << " " << rows;
      }
    for (int64_t c0 = 0; c0 < 96; c0 += 48) {
      EXPECT_TRUE(torch::equal(torch::addmm(b.narrow(0, c0, 48), x, w.narrow(0, c0, 48).t()), y.narrow(1, c0, 48)));
      EXPECT_TRUE(torch::equal(torch::mm(x, w.narrow(0, c0, 48).t()), y0.narrow(1, c0, 48)));
    }
    for (int64_t c0 = 0; c0 < k; c0 += k / 2)
      EXPECT_TRUE(torch::equal(torch::mm(dy, w.narrow(1, c0, k / 2)), dx.narrow(1, c0, k / 2))) << k;
    // F::linear's autograd computes dW = dY^T X and dX = dY W as these calls do.
    auto xl = x.clone().requires_grad_(true), wl = w.clone().requires_grad_(true), bl = b.clone().requires_grad_(true);
    F::linear(xl.view({32, 2, k}), wl, bl).backward(dy.view({32, 2, 96}));
    EXPECT_TRUE(torch::equal(wl.grad(), torch::mm(dy.t(), x)));
    EXPECT_TRUE(torch::equal(xl.grad(), dx));
    EXPECT_TRUE(torch::equal(bl.grad(), dy.sum(0)));
  }
}

}  // namespace
}  // namespace fp8tron
