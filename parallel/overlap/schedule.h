// Chunk schedules of the overlapped tensor-parallel linears: pure functions of the group size n and
// this rank r, so every rank derives the same plan and the sends and receives pair up. "Chunk c"
// is the sequence shard first held by rank c: rows [c L, (c + 1) L) of the gathered tensor.
// Torch-free; tests/parallel/test_overlap_schedule.cpp checks the invariants and the tables of
// docs/overlap.md (Transformer Engine's userbuffer algorithms, comm_gemm_overlap.cpp).
#pragma once
#include <cstdint>
#include <vector>

namespace fp8tron::overlap {

// One step of an all-gather that feeds a GEMM. In a step the transfer and the GEMM run at the same
// time: `compute` lists chunks held before the step, `send` chunks held before the step going to
// `send_to`, `recv` chunks arriving from `recv_from`, usable from the next step on. -1: no peer.
struct AllGatherStep {
  std::vector<int> compute;
  std::vector<int> send;
  int send_to = -1;
  std::vector<int> recv;
  int recv_from = -1;
};

// Ring exchange (TE's split_overlap_ag): n steps; step i computes chunk (r - i) mod n and, but in
// the last step, sends it to r + 1 while chunk (r - i - 1) mod n arrives from r - 1.
std::vector<AllGatherStep> ring_all_gather(int n, int r);

// TE's `aggregate` ring (n even, >= 4): neighbours (r, r xor 1) first swap their chunks (a step
// without GEMM), then a ring of pairs {c, c + 1} over stride 2: step k computes the pair starting
// at (b - 2k) mod n (b = r rounded down to even) and passes it to r + 2.
std::vector<AllGatherStep> ring_all_gather_aggregate(int n, int r);

// One step of a ring reduce-scatter (TE's CommOverlapP2PBase::split_overlap_rs): the GEMM computes
// the partial output of destination rank `gemm_dest`; meanwhile the partial of the previous step
// goes straight to its destination `send_to`, and the partial that rank `recv_from` computed for r
// arrives. The last step computes r's own rows; then the n partials are summed in rank order.
struct ReduceScatterStep {
  int gemm_dest = 0;
  int send_to = -1;
  int recv_from = -1;
};
std::vector<ReduceScatterStep> ring_reduce_scatter(int n, int r);

// [begin, begin + count) pieces of `total` split into `parts` equal pieces (total % parts == 0).
struct Range {
  int64_t begin = 0;
  int64_t count = 0;
};
std::vector<Range> even_splits(int64_t total, int parts);

// The rows of the gathered tensor that piece p of chunk c covers when each rank's L rows are cut
// into `pieces` pieces (MindSpeed CoC's all-gather pieces).
Range piece_rows(int64_t local_rows, int pieces, int chunk, int piece);

}  // namespace fp8tron::overlap
