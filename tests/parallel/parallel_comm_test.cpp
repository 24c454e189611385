// Communicators and parallel state, 4 ranks: the uneven collectives the overlapped distributed
// optimizer and the MoE token dispatchers use (with their autograd pairs), and the expert-parallel
// groups. Under mpirun on CPU (MPI), or with --device cuda over NCCL (tests/parallel/nccl_launch.sh, also
// under torchrun). Every rank runs every test in the same order (collectives must match); any
// rank's failure fails the job.
#include <gtest/gtest.h>
#include <torch/cuda.h>

#include <algorithm>
#include <chrono>
#include <numeric>

#include "core/text.h"
#include "fp8/packed_rows.h"
#include "fp8/recipe.h"
#include "models/moe/token_dispatcher.h"
#include "parallel/grad_buckets.h"
#include "parallel/launch_env.h"
#include "parallel/moe_comm.h"
#include "parallel/parallel_state.h"

namespace fp8tron {
namespace {

using Groups = std::vector<std::vector<int>>;
constexpr int kWorld = 4;
// --device cuda: NCCL communicators and tensors on this rank's GPU; otherwise MPI on the CPU.
torch::Device g_device = torch::kCPU;

ParallelState state_for(int tp, int pp, int ep, int etp) {
  auto sizes = ParallelSizes::derive(kWorld, tp, 1, pp, ep, etp, false);
  const CommTimeouts timeouts{std::chrono::minutes(2), std::chrono::seconds(90)};
  if (g_device.is_cuda()) return build_parallel_state(make_nccl_transport(read_launch_env(), g_device.index(), timeouts), sizes, false);
  return build_parallel_state(make_mpi_transport(timeouts), sizes, false);
}

// A tensor on the test's device.
torch::Tensor dev(const torch::Tensor& t) { return t.to(g_device); }

// The value every rank contributes: distinct per rank and element.
torch::Tensor contribution(int world_rank, int64_t n, torch::Dtype dtype = torch::kFloat32) {
  return dev((torch::arange(n, torch::kFloat64) + 1000.0 * (world_rank + 1)).to(dtype));
}

// The member of `groups` that holds `rank`.
std::vector<int> group_of(const Groups& groups, int rank) {
  for (const auto& g : groups)
    if (std::find(g.begin(), g.end(), rank) != g.end()) return g;
  return {};
}

void expect_group(Communicator& comm, const Groups& expected, int world_rank) {
  const auto members = group_of(expected, world_rank);
  ASSERT_FALSE(members.empty());
  EXPECT_EQ(comm.global_ranks(), members) << comm.name();
  EXPECT_EQ(comm.size(), int(members.size())) << comm.name();
  EXPECT_EQ(comm.rank(), int(std::find(members.begin(), members.end(), world_rank) - members.begin())) << comm.name();
  // An all-reduce over the group sums exactly its members' contributions.
  auto t = contribution(world_rank, 5);
  comm.all_reduce_async(t, ReduceOp::Sum)->wait();
  auto want = dev(torch::zeros({5}, torch::kFloat32));
  for (int r : members) want += contribution(r, 5);
  EXPECT_TRUE(torch::equal(t, want)) << comm.name() << ": " << t << " vs " << want;
}

TEST(ShardCounts, SplitsRangesAtShardBoundaries) {
  EXPECT_EQ(shard_counts(0, 12, 3, 4), (std::vector<int64_t>{3, 3, 3, 3}));
  EXPECT_EQ(shard_counts(2, 5, 3, 4), (std::vector<int64_t>{1, 3, 1, 0}));
  EXPECT_EQ(shard_counts(3, 3, 3, 4), (std::vector<int64_t>{0, 3, 0, 0}));
  EXPECT_EQ(shard_counts(10, 2, 3, 4), (std::vector<int64_t>{0, 0, 0, 2}));
  EXPECT_EQ(shard_counts(4, 0, 3, 4), (std::vector<int64_t>{0, 0, 0, 0}));
}

TEST(BucketSpans, WholeParametersAndPaddingInTheLastBucket) {
  std::vector<BufferParam> params;
  int64_t offset = 0;
  for (int64_t n : {4, 3, 6, 2, 5}) {
    params.push_back(BufferParam{torch::Tensor(), offset, n, 0});
    offset += n;
  }
  const auto spans = bucket_spans(params, 6, 24);  // 20 elements + 4 of padding
  ASSERT_EQ(spans.size(), 3u);
  EXPECT_EQ(spans[0].offset, 0); EXPECT_EQ(spans[0].numel, 7);
  EXPECT_EQ(spans[1].offset, 7); EXPECT_EQ(spans[1].numel, 6);
  EXPECT_EQ(spans[2].offset, 13); EXPECT_EQ(spans[2].numel, 11);
  EXPECT_EQ(spans[2].params, (std::vector<size_t>{3, 4}));
}

// Uneven reduce-scatter over the world, with empty pieces, in place (out is a piece of in) and
// into a separate tensor, in fp32 and bf16 (MPI reduces bf16 through fp32).
TEST(Communicator, ReduceScatterV) {
  ParallelState s = state_for(1, 1, 1, 1);
  const int me = s.world_rank;
  const std::vector<int64_t> counts = {3, 0, 5, 1};
  const int64_t total = 9, begin = std::accumulate(counts.begin(), counts.begin() + me, int64_t(0));
  auto want = dev(torch::zeros({total}, torch::kFloat64));
  for (int r = 0; r < kWorld; ++r) want += contribution(r, total, torch::kFloat64);
  want = want.narrow(0, begin, counts[size_t(me)]);
  for (auto dtype : {torch::kFloat32, torch::kBFloat16}) {
    auto in = contribution(me, total, dtype);
    auto out = dev(torch::full({counts[size_t(me)]}, -1.0, dtype));
    s.world->reduce_scatter_v_async(out, in, counts)->wait();
    EXPECT_TRUE(torch::allclose(out.to(torch::kFloat64), want, 1e-2, 0)) << out << want;
    EXPECT_TRUE(torch::equal(in, contribution(me, total, dtype))) << "the input must be left alone";
    auto piece = in.narrow(0, begin, counts[size_t(me)]);
    s.world->reduce_scatter_v_async(piece, in, counts)->wait();
    EXPECT_TRUE(torch::allclose(piece.to(torch::kFloat64), want, 1e-2, 0)) << piece << want;
  }
}

TEST(Communicator, AllGatherV) {
  ParallelState s = state_for(1, 1, 1, 1);
  const int me = s.world_rank;
  const std::vector<int64_t> counts = {2, 4, 0, 3};
  const int64_t total = 9;
  std::vector<int64_t> begin(kWorld, 0);
  for (int r = 1; r < kWorld; ++r) begin[size_t(r)] = begin[size_t(r - 1)] + counts[size_t(r - 1)];
  auto want = dev(torch::empty({total}, torch::kFloat32));
  for (int r = 0; r < kWorld; ++r)
    want.narrow(0, begin[size_t(r)], counts[size_t(r)]).copy_(contribution(r, counts[size_t(r)]));
  for (auto dtype : {torch::kFloat32, torch::kBFloat16}) {
    // Separate input.
    auto out = dev(torch::full({total}, -1.0, dtype));
    auto in = contribution(me, counts[size_t(me)], dtype);
    s.world->all_gather_v_async(out, in, counts)->wait();
    EXPECT_TRUE(torch::equal(out, want.to(dtype))) << out;
    // In place: this rank's piece already sits in the output.
    auto buffer = dev(torch::full({total}, -1.0, dtype));
    buffer.narrow(0, begin[size_t(me)], counts[size_t(me)]).copy_(in);
    auto own = buffer.narrow(0, begin[size_t(me)], counts[size_t(me)]);
    s.world->all_gather_v_async(buffer, own, counts)->wait();
    EXPECT_TRUE(torch::equal(buffer, want.to(dtype))) << buffer;
  }
}

TEST(Communicator, UnevenPiecesMustAddUp) {
  ParallelState s = state_for(1, 1, 1, 1);
  auto in = dev(torch::zeros({8}));
  auto out = dev(torch::zeros({2}));
  EXPECT_THROW(s.world->reduce_scatter_v_async(out, in, {2, 2, 2}), std::exception);  // 3 counts for 4 ranks
  EXPECT_THROW(s.world->reduce_scatter_v_async(out, in, {2, 2, 2, 1}), std::exception);  // 7 != 8
}

// Rows rank `from` sends to rank `to` in the all-to-all tests: uneven, some zero.
int64_t rows_between(int from, int to) { return (from * 3 + to * 2) % 5 == 0 ? 0 : (from + 2 * to) % 4 + 1; }
// Row i of what `from` sends to `to`: a recognisable value per (from, to, i, column).
torch::Tensor rows_for(int from, int to, int64_t columns, torch::Dtype dtype) {
  const int64_t n = rows_between(from, to);
  auto r = torch::arange(n, torch::kFloat64).unsqueeze(1) * 10 + torch::arange(columns, torch::kFloat64).unsqueeze(0);
  return dev((r + 1000.0 * from + 100.0 * to).to(dtype));
}

TEST(Communicator, AllToAllVMovesUnevenRows) {
  ParallelState s = state_for(1, 1, 1, 1);
  const int me = s.world_rank;
  for (auto dtype : {torch::kFloat32, torch::kBFloat16, torch::kInt64}) {
    std::vector<int64_t> send, recv;
    std::vector<torch::Tensor> outgoing, expected;
    for (int r = 0; r < kWorld; ++r) {
      send.push_back(rows_between(me, r));
      recv.push_back(rows_between(r, me));
      outgoing.push_back(rows_for(me, r, 3, dtype));
      expected.push_back(rows_for(r, me, 3, dtype));
    }
    auto in = torch::cat(outgoing, 0);
    auto out = dev(torch::full({std::accumulate(recv.begin(), recv.end(), int64_t(0)), 3}, -1, dtype));
    s.world->all_to_all_v_async(out, in, send, recv)->wait();
    EXPECT_TRUE(torch::equal(out, torch::cat(expected, 0))) << out;
  }
  // Counts that do not match the tensors are refused.
  auto in = dev(torch::zeros({3, 2}));
  auto out = dev(torch::zeros({3, 2}));
  EXPECT_THROW(s.world->all_to_all_v_async(out, in, {1, 1, 1}, {1, 1, 1}), std::exception);
  EXPECT_THROW(s.world->all_to_all_v_async(out, in, {1, 1, 1, 1}, {1, 1, 1, 0}), std::exception);
}

// The autograd pairs: forward as the collective, backward as its partner (checked against the
// gradient of an explicit sum of the gathered values).
TEST(MoeComm, AllToAllRowsBackwardIsTheReverseExchange) {
  ParallelState s = state_for(1, 1, 1, 1);
  const int me = s.world_rank;
  std::vector<int64_t> send, recv;
  for (int r = 0; r < kWorld; ++r) {
    send.push_back(rows_between(me, r));
    recv.push_back(rows_between(r, me));
  }
  const int64_t rows = std::accumulate(send.begin(), send.end(), int64_t(0));
  auto x = dev(torch::arange(rows * 2, torch::kFloat64).view({rows, 2}) + 100.0 * me).requires_grad_(true);
  auto y = all_to_all_rows(x, *s.world, send, recv);
  // Weight each received row by its value: d(sum y^2 / 2)/dy = y, so dx must be x itself.
  (y * y / 2).sum().backward();
  EXPECT_TRUE(torch::allclose(x.grad(), x.detach())) << x.grad();
}

TEST(MoeComm, GatherAndReduceScatterRowsV) {
  ParallelState s = state_for(1, 1, 1, 1);
  const int me = s.world_rank;
  const std::vector<int64_t> rows = {2, 0, 3, 1};
  auto x = dev(torch::ones({rows[size_t(me)], 3}, torch::kFloat64) * (me + 1)).requires_grad_(true);
  auto all = all_gather_rows_v(x, *s.world, rows);
  ASSERT_EQ(all.size(0), 6);
  EXPECT_EQ(all[0][0].item<double>(), 1.0);
  EXPECT_EQ(all[2][0].item<double>(), 3.0);
  EXPECT_EQ(all[5][0].item<double>(), 4.0);
  // Every rank weights the gathered rows by (its rank + 1): the gradient of rank r's rows is the
  // sum of the weights, 1 + 2 + 3 + 4 = 10.
  (all * double(me + 1)).sum().backward();
  EXPECT_TRUE(torch::allclose(x.grad(), torch::full_like(x, 10.0))) << x.grad();
  // Reduce-scatter: sums over ranks, each keeps its piece; backward gathers the pieces.
  auto z = dev(torch::ones({6, 2}, torch::kFloat64) * (me + 1)).requires_grad_(true);
  auto piece = reduce_scatter_rows_v(z, *s.world, rows);
  ASSERT_EQ(piece.size(0), rows[size_t(me)]);
  if (piece.numel() > 0) EXPECT_EQ(piece[0][0].item<double>(), 10.0);
  (piece * double(me + 1)).sum().backward();
  auto want = dev(torch::cat({torch::full({2, 2}, 1.0), torch::full({3, 2}, 3.0), torch::full({1, 2}, 4.0)}).to(torch::kFloat64));
  EXPECT_TRUE(torch::allclose(z.grad(), want)) << z.grad();
}

// --moe-dispatch-fp8 over real expert-parallel groups (EP4; EP2 x expert TP2, whose all-gather
// moves the packed rows too; EP2 x expert DP2), blockwise and MXFP8: the FP8 dispatch delivers, bit
// for bit, the codes and scales the receiver's own cast of the bf16 dispatch's rows gives, and
// their values; the all-to-all sends row_bytes per token to the other ranks where the bf16
// dispatch sends H x its element size (the measured counter); the backward (gradients in the
// activations' dtype) and the combine are the bf16 dispatch's, bit for bit.
TEST(MoeDispatchFp8, DeliversTheReceiversCodesAndCountsItsBytes) {
  struct Layout {
    int tp, ep, etp;
  };
  constexpr int64_t kExperts = 8, kTokens = 37, kHidden = 160;
  const auto dtype = g_device.is_cuda() ? torch::kBFloat16 : torch::kFloat32;
  for (const Layout layout : {Layout{1, 4, 1}, Layout{2, 2, 2}, Layout{1, 2, 1}})
    for (const auto kind : {fp8::RecipeKind::kBlockwise, fp8::RecipeKind::kMxfp8}) {
      SCOPED_TRACE(strprintf("tp %d ep %d etp %d, %s", layout.tp, layout.ep, layout.etp, fp8::recipe_kind_name(kind)));
      ParallelState s = state_for(layout.tp, 1, layout.ep, layout.etp);
      const int me = s.world_rank;
      ExpertParallelGroups groups{s.ep, s.expert_tp, s.expert_tp_ep, s.tp_cp, s.tp_dp_cp, s.ep_rank, s.expert_tp_rank};
      MoeConfig moe;
      moe.num_experts = kExperts;
      moe.dispatcher = MoeDispatcher::kAllToAll;
      fp8::Fp8EngineOptions o;
      o.recipe = fp8::make_recipe(kind, fp8::Fp8Format::kE4M3);
      auto engine = std::make_shared<fp8::Fp8Engine>(o, g_device);
      // Each rank routes its own tokens (top-2 of random scores, some experts left idle).
      torch::manual_seed(100 + me);
      auto x = (torch::randn({kTokens, kHidden}) * torch::pow(2.0, torch::randint(-6, 6, {kTokens, 1}).to(torch::kFloat32)))
                   .to(dtype)
                   .to(g_device);
      auto scores = torch::rand({kTokens, kExperts});
      scores.select(1, 5).mul_(0.01);  // expert 5 rarely chosen
      const auto top = std::get<1>(scores.topk(2, 1));
      auto map = torch::zeros({kTokens, kExperts}, torch::kBool).scatter_(1, top, true);
      auto probs = torch::where(map, torch::softmax(scores, 1), torch::zeros({}));
      moe::Routing routing{probs.to(g_device), map.to(g_device), torch::Tensor()};
      struct Run {
        DispatchedTokens out;
        torch::Tensor dx, combined;
        int64_t bytes = 0;
      };
      const auto grad = torch::randn({1, kHidden}).to(dtype).to(g_device);
      auto run = [&](bool fp8_dispatch) {
        auto context = std::make_shared<MoeContext>(moe, 1, groups);
        DispatcherOptions opts{kExperts, kExperts / layout.ep, 0, groups, context.get(), fp8_dispatch ? engine : nullptr};
        auto dispatcher = make_token_dispatcher(MoeDispatcher::kAllToAll, opts);
        auto xin = x.clone().requires_grad_(true);
        Run r;
        r.out = dispatcher->dispatch(xin, routing);
        r.bytes = context->take_dispatch_bytes();
        // Rows weighted by their position: the gradient tells the rows apart.
        const auto weight = torch::arange(r.out.tokens.size(0), torch::TensorOptions().dtype(torch::kFloat32))
                                .unsqueeze(1)
                                .to(dtype)
                                .to(g_device);
        (r.out.tokens * weight * grad).sum().backward();
        r.dx = xin.grad();
        // The experts' outputs: the same for both runs.
        torch::manual_seed(7);
        r.combined = dispatcher->combine(torch::randn({r.out.tokens.size(0), kHidden}).to(dtype).to(g_device));
        return r;
      };
      const Run off = run(false), on = run(true);
      ASSERT_FALSE(off.out.packed.defined());
      ASSERT_TRUE(on.out.packed.defined());
      EXPECT_EQ(on.out.tokens_per_expert, off.out.tokens_per_expert);
      // The sender's codes are the ones the receiver's cast of the bf16 rows gives, and their values.
      const auto own = fp8::quantize_packed_rows(*engine, off.out.tokens.detach());
      EXPECT_TRUE(torch::equal(on.out.packed, own));
      EXPECT_TRUE(torch::equal(on.out.tokens.detach(),
                               fp8::dequantize_packed_rows(*engine, own, kHidden).to(dtype)));
      // Bytes: the same rows, row_bytes each against H elements.
      const int64_t row_bytes = fp8::packed_row_layout(engine->recipe(), kHidden).row_bytes();
      const int64_t element = int64_t(torch::elementSize(dtype));
      EXPECT_GT(off.bytes, 0);
      EXPECT_EQ(off.bytes % (kHidden * element), 0);
      EXPECT_EQ(on.bytes, off.bytes / (kHidden * element) * row_bytes);
      // Backward and combine in the activations' dtype, as without the flag.
      EXPECT_TRUE(torch::equal(on.dx, off.dx));
      EXPECT_TRUE(torch::equal(on.combined, off.combined));
    }
}

// Megatron's expert grid, world 4, tp 1, ep 2: ep {0,1},{2,3}; expert-dp {0,2},{1,3}; expert-tp
// single ranks; the dense data-parallel group is all four ranks.
TEST(ParallelState, ExpertGroupsTp1Ep2) {
  ParallelState s = state_for(1, 1, 2, 1);
  const int me = s.world_rank;
  EXPECT_EQ(s.sizes.edp, 2);
  expect_group(*s.ep, {{0, 1}, {2, 3}}, me);
  expect_group(*s.expert_dp, {{0, 2}, {1, 3}}, me);
  expect_group(*s.expert_tp, {{0}, {1}, {2}, {3}}, me);
  expect_group(*s.expert_tp_ep, {{0, 1}, {2, 3}}, me);
  expect_group(*s.dp, {{0, 1, 2, 3}}, me);
  EXPECT_EQ(s.ep_rank, me % 2);
  EXPECT_EQ(s.expert_dp_rank, me / 2);
  EXPECT_EQ(s.expert_tp_rank, 0);
}

// tp 2 (expert-tp defaults to it), ep 2: expert-tp {0,1},{2,3} is the dense tp group itself;
// ep {0,2},{1,3}; the token all-to-all group is everyone; no expert data parallelism.
TEST(ParallelState, ExpertGroupsTp2Ep2) {
  ParallelState s = state_for(2, 1, 2, 2);
  const int me = s.world_rank;
  EXPECT_EQ(s.sizes.edp, 1);
  EXPECT_EQ(s.expert_tp, s.tp) << "an expert group equal to a dense one shares its communicator";
  expect_group(*s.expert_tp, {{0, 1}, {2, 3}}, me);
  expect_group(*s.ep, {{0, 2}, {1, 3}}, me);
  expect_group(*s.expert_tp_ep, {{0, 1, 2, 3}}, me);
  expect_group(*s.expert_dp, {{0}, {1}, {2}, {3}}, me);
  EXPECT_EQ(s.ep_rank, me / 2);
}

// With pipeline stages: tp 1, pp 2, ep 2 -> ranks {0,1} are stage 0 and {2,3} stage 1 (pp is the
// slowest dimension); each stage is one expert-parallel group.
TEST(ParallelState, ExpertGroupsWithPipeline) {
  ParallelState s = state_for(1, 2, 2, 1);
  const int me = s.world_rank;
  expect_group(*s.pp, {{0, 2}, {1, 3}}, me);
  expect_group(*s.ep, {{0, 1}, {2, 3}}, me);
  expect_group(*s.expert_dp, {{0}, {1}, {2}, {3}}, me);
}

// Without expert parallelism the expert groups are the dense ones: no new communicators.
TEST(ParallelState, NoExpertParallelismReusesDenseGroups) {
  ParallelState s = state_for(2, 1, 1, 2);
  EXPECT_EQ(s.expert_tp, s.tp);
  EXPECT_EQ(s.expert_dp, s.dp);
  EXPECT_EQ(s.expert_tp_ep, s.tp);
  EXPECT_EQ(s.ep->size(), 1);
  expect_group(*s.expert_dp, {{0, 2}, {1, 3}}, s.world_rank);
}

}  // namespace
}  // namespace fp8tron

// gtest's own main, plus --device cpu|cuda (cuda: this rank's GPU is LOCAL_RANK % GPUs).
int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  for (int i = 1; i + 1 < argc; ++i)
    if (std::string(argv[i]) == "--device" && std::string(argv[i + 1]) == "cuda") {
      const int gpus = std::max(1, int(torch::cuda::device_count()));
      fp8tron::g_device = torch::Device(torch::kCUDA, fp8tron::read_launch_env().local_rank % gpus);
    }
  return RUN_ALL_TESTS();
}
