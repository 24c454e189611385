// The chunk schedules of the overlapped tensor-parallel linears (parallel/overlap/schedule.h):
// invariants for several group sizes, simulated over all ranks, and the TP2/TP4 tables of
// docs/overlap.md (Transformer Engine's userbuffer algorithms) verbatim.
#include <gtest/gtest.h>

#include <set>

#include "parallel/overlap/schedule.h"
#include "parallel/pipeline_schedule.h"

using namespace fp8tron::overlap;

namespace {

// Runs an all-gather schedule on every rank at once: a chunk must be held before it is computed or
// sent, every receive must be the matching sender's send of the same step, and at the end every
// rank has computed every chunk exactly once.
void check_all_gather(int n, bool aggregate) {
  std::vector<std::vector<AllGatherStep>> plan;
  for (int r = 0; r < n; ++r) plan.push_back(aggregate ? ring_all_gather_aggregate(n, r) : ring_all_gather(n, r));
  std::vector<std::set<int>> held(static_cast<size_t>(n)), computed(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) held[size_t(r)] = {r};
  const size_t steps = plan[0].size();
  for (int r = 0; r < n; ++r) ASSERT_EQ(plan[size_t(r)].size(), steps) << "rank " << r;
  for (size_t i = 0; i < steps; ++i) {
    std::vector<std::set<int>> arriving(static_cast<size_t>(n));
    for (int r = 0; r < n; ++r) {
      const AllGatherStep& s = plan[size_t(r)][i];
      for (int c : s.compute) {
        EXPECT_TRUE(held[size_t(r)].count(c)) << "n=" << n << " rank " << r << " step " << i << " computes chunk " << c << " before holding it";
        EXPECT_TRUE(computed[size_t(r)].insert(c).second) << "rank " << r << " computes chunk " << c << " twice";
      }
      for (int c : s.send) EXPECT_TRUE(held[size_t(r)].count(c)) << "rank " << r << " step " << i << " sends chunk " << c << " before holding it";
      if (s.recv.empty()) continue;
      ASSERT_GE(s.recv_from, 0);
      const AllGatherStep& peer = plan[size_t(s.recv_from)][i];
      EXPECT_EQ(peer.send_to, r) << "n=" << n << " step " << i << ": rank " << r << " receives from " << s.recv_from << ", which sends elsewhere";
      EXPECT_EQ(peer.send, s.recv) << "n=" << n << " step " << i << ": rank " << r << " receives other chunks than are sent";
      for (int c : s.recv) arriving[size_t(r)].insert(c);
    }
    for (int r = 0; r < n; ++r) held[size_t(r)].insert(arriving[size_t(r)].begin(), arriving[size_t(r)].end());
  }
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(computed[size_t(r)].size(), size_t(n)) << "rank " << r << " does not compute every chunk";
    EXPECT_EQ(held[size_t(r)].size(), size_t(n)) << "rank " << r << " does not end with every chunk";
  }
}

AllGatherStep step(std::vector<int> compute, std::vector<int> send, int to, std::vector<int> recv, int from) {
  return {std::move(compute), std::move(send), to, std::move(recv), from};
}
void expect_step(const AllGatherStep& got, const AllGatherStep& want, int r, int i) {
  EXPECT_EQ(got.compute, want.compute) << "rank " << r << " step " << i;
  EXPECT_EQ(got.send, want.send) << "rank " << r << " step " << i;
  EXPECT_EQ(got.send_to, want.send_to) << "rank " << r << " step " << i;
  EXPECT_EQ(got.recv, want.recv) << "rank " << r << " step " << i;
  EXPECT_EQ(got.recv_from, want.recv_from) << "rank " << r << " step " << i;
}

}  // namespace

TEST(OverlapSchedule, RingAllGatherInvariants) {
  for (int n : {1, 2, 3, 4, 5, 8}) check_all_gather(n, false);
}

TEST(OverlapSchedule, AggregatedRingInvariants) {
  for (int n : {4, 6, 8}) check_all_gather(n, true);
}

// docs/overlap.md, "Ring-exchange AG+GEMM", N = 2 and N = 4.
TEST(OverlapSchedule, RingAllGatherTables) {
  const std::vector<std::vector<AllGatherStep>> tp2 = {
      {step({0}, {0}, 1, {1}, 1), step({1}, {}, -1, {}, -1)},
      {step({1}, {1}, 0, {0}, 0), step({0}, {}, -1, {}, -1)}};
  for (int r = 0; r < 2; ++r)
    for (int i = 0; i < 2; ++i) expect_step(ring_all_gather(2, r)[size_t(i)], tp2[size_t(r)][size_t(i)], r, i);
  // rank r, step i: computes (r - i) mod 4, sends it to r + 1, receives (r - i - 1) mod 4 from r - 1.
  const int compute[4][4] = {{0, 3, 2, 1}, {1, 0, 3, 2}, {2, 1, 0, 3}, {3, 2, 1, 0}};
  const int recv[4][3] = {{3, 2, 1}, {0, 3, 2}, {1, 0, 3}, {2, 1, 0}};
  for (int r = 0; r < 4; ++r) {
    const auto s = ring_all_gather(4, r);
    for (int i = 0; i < 4; ++i) {
      if (i < 3) expect_step(s[size_t(i)], step({compute[r][i]}, {compute[r][i]}, (r + 1) % 4, {recv[r][i]}, (r + 3) % 4), r, i);
      else expect_step(s[size_t(i)], step({compute[r][i]}, {}, -1, {}, -1), r, i);
    }
  }
}

// docs/overlap.md, "aggregate: 1", N = 4.
TEST(OverlapSchedule, AggregatedRingTable) {
  const std::vector<std::vector<AllGatherStep>> tp4 = {
      {step({}, {0}, 1, {1}, 1), step({0, 1}, {0, 1}, 2, {2, 3}, 2), step({2, 3}, {}, -1, {}, -1)},
      {step({}, {1}, 0, {0}, 0), step({0, 1}, {0, 1}, 3, {2, 3}, 3), step({2, 3}, {}, -1, {}, -1)},
      {step({}, {2}, 3, {3}, 3), step({2, 3}, {2, 3}, 0, {0, 1}, 0), step({0, 1}, {}, -1, {}, -1)},
      {step({}, {3}, 2, {2}, 2), step({2, 3}, {2, 3}, 1, {0, 1}, 1), step({0, 1}, {}, -1, {}, -1)}};
  for (int r = 0; r < 4; ++r)
    for (int i = 0; i < 3; ++i) expect_step(ring_all_gather_aggregate(4, r)[size_t(i)], tp4[size_t(r)][size_t(i)], r, i);
}

TEST(OverlapSchedule, RingReduceScatterInvariants) {
  for (int n : {1, 2, 3, 4, 8}) {
    std::vector<std::vector<ReduceScatterStep>> plan;
    for (int r = 0; r < n; ++r) plan.push_back(ring_reduce_scatter(n, r));
    for (int r = 0; r < n; ++r) {
      std::set<int> dests;
      for (int i = 0; i < n; ++i) {
        const ReduceScatterStep& s = plan[size_t(r)][size_t(i)];
        dests.insert(s.gemm_dest);
        if (i == 0) {
          EXPECT_EQ(s.send_to, -1);
          continue;
        }
        // The partial sent in step i is the one computed in step i - 1, to its destination.
        EXPECT_EQ(s.send_to, plan[size_t(r)][size_t(i - 1)].gemm_dest) << "n=" << n << " rank " << r << " step " << i;
        EXPECT_EQ(plan[size_t(s.recv_from)][size_t(i)].send_to, r) << "n=" << n << " rank " << r << " step " << i;
      }
      EXPECT_EQ(dests.size(), size_t(n)) << "rank " << r << " misses a destination";
      EXPECT_EQ(plan[size_t(r)].back().gemm_dest, r) << "the last GEMM computes the rank's own rows";
    }
  }
}

// docs/overlap.md, "Ring-exchange GEMM+RS", N = 4: GEMM destinations, sends and receives.
TEST(OverlapSchedule, RingReduceScatterTable) {
  const int dest[4][4] = {{1, 2, 3, 0}, {2, 3, 0, 1}, {3, 0, 1, 2}, {0, 1, 2, 3}};
  const int send[4][4] = {{-1, 1, 2, 3}, {-1, 2, 3, 0}, {-1, 3, 0, 1}, {-1, 0, 1, 2}};
  const int from[4][4] = {{-1, 3, 2, 1}, {-1, 0, 3, 2}, {-1, 1, 0, 3}, {-1, 2, 1, 0}};
  for (int r = 0; r < 4; ++r) {
    const auto s = ring_reduce_scatter(4, r);
    for (int i = 0; i < 4; ++i) {
      EXPECT_EQ(s[size_t(i)].gemm_dest, dest[r][i]) << "rank " << r << " step " << i;
      EXPECT_EQ(s[size_t(i)].send_to, send[r][i]) << "rank " << r << " step " << i;
      EXPECT_EQ(s[size_t(i)].recv_from, from[r][i]) << "rank " << r << " step " << i;
    }
  }
  const auto tp2 = ring_reduce_scatter(2, 0);
  EXPECT_EQ(tp2[0].gemm_dest, 1);
  EXPECT_EQ(tp2[1].gemm_dest, 0);
  EXPECT_EQ(tp2[1].send_to, 1);
  EXPECT_EQ(tp2[1].recv_from, 1);
}

TEST(OverlapSchedule, SplitsAndPieces) {
  const auto s = even_splits(32, 4);
  ASSERT_EQ(s.size(), 4u);
  for (int p = 0; p < 4; ++p) {
    EXPECT_EQ(s[size_t(p)].begin, 8 * p);
    EXPECT_EQ(s[size_t(p)].count, 8);
  }
  // Each rank's 8 rows in 2 pieces: piece 1 of chunk 3 is rows 28..31 of the gathered tensor.
  EXPECT_EQ(piece_rows(8, 2, 3, 1).begin, 28);
  EXPECT_EQ(piece_rows(8, 2, 3, 1).count, 4);
  EXPECT_EQ(piece_rows(8, 2, 0, 0).begin, 0);
  EXPECT_THROW(even_splits(30, 4), std::exception);
}

// Megatron's overlap_p2p_comm over the interleaved order: receives prefetched in the steady state
// (from the last warmup step on), not in the cool-down, everywhere with warmup_flush, nowhere
// without the overlap.
TEST(PipelineOverlap, WhichStepsPrefetchTheirReceive) {
  using fp8tron::PipelineOverlap;
  using fp8tron::PipelineStep;
  // pp 2, rank 0, 2 chunks, 4 micro-batches: warmup of (2 - 0 - 1) * 2 + (2 - 1) * 2 = 4 forwards,
  // then 4 forward/backward pairs (steps 4..11), then 4 backwards.
  const std::vector<PipelineStep> order = fp8tron::pipeline_order(2, 0, 2, 4);
  ASSERT_EQ(order.size(), 16u);
  ASSERT_TRUE(order[3].forward && order[4].forward && !order[5].forward && order[10].forward && !order[11].forward &&
              !order[12].forward);
  for (size_t i = 0; i < order.size(); ++i) {
    EXPECT_FALSE(fp8tron::prefetches_next_receive(order, i, PipelineOverlap{false, false})) << i;
    EXPECT_EQ(fp8tron::prefetches_next_receive(order, i, PipelineOverlap{true, true}), i + 1 < order.size()) << i;
    // Steady state: steps 4..11 (the last warmup step, 3, prefetches step 4's).
    const bool steady = i + 1 >= 4 && i + 1 <= 11;
    EXPECT_EQ(fp8tron::prefetches_next_receive(order, i, PipelineOverlap{true, false}), steady) << i;
  }
}
