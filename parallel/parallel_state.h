// The explicit parallel state handed to every module (no globals): this rank's coordinates in
// the tp-cp-ep-dp-pp grid and a communicator per group it belongs to.
#pragma once
#include <memory>

#include "parallel/communicator.h"
#include "parallel/progress_board.h"
#include "parallel/topology.h"

namespace fp8tron {

struct LaunchEnv;

struct ParallelState {
  // Declared first so it is destroyed last: the transport owns process-wide state (MPI, NCCL).
  std::shared_ptr<Transport> transport;
  ParallelSizes sizes;
  int world_rank = 0;
  int tp_rank = 0, cp_rank = 0, dp_rank = 0, pp_rank = 0;
  bool sequence_parallel = false;
  std::shared_ptr<Communicator> world, tp, dp, pp, cp;
  // The expert grid (etp-ep-edp-pp, Megatron's expert RankGenerator) for mixture-of-experts
  // layers: expert_tp shards each expert's weights, ep spreads the experts over ranks (the token
  // all-to-all runs over expert_tp_ep), expert_dp holds replicas of the same experts (their
  // gradients' data-parallel group). A group equal to a dense one shares its communicator (with
  // ep = 1, expert_tp is tp and expert_dp is dp).
  int ep_rank = 0, expert_tp_rank = 0, expert_dp_rank = 0;
  std::shared_ptr<Communicator> ep, expert_tp, expert_tp_ep, expert_dp;
  // Dense groups the MoE router reduces over (Megatron's tp_cp and tp_dp_cp groups): aux-loss
  // token counts and the z-loss normalisation over tp x cp; expert-bias counts, the global aux
  // loss and metric averages over tp x dp x cp (all ranks of a pipeline stage).
  std::shared_ptr<Communicator> tp_cp, tp_dp_cp;
  // First and last pipeline stages of this rank's pipeline: they share the tied embedding.
  std::shared_ptr<Communicator> embedding;
  // Pipeline messages: each rank sends activations on forward_senders[its pp rank] and gradients
  // on backward_senders[its pp rank]; a receiver listens on the sender's communicator. With one
  // kind of message per communicator and sender, NCCL's in-order matching is unambiguous and a
  // rank's sends never queue behind its own receives.
  std::vector<std::shared_ptr<Communicator>> forward_senders, backward_senders;
  // Every rank's progress for hang reports (progress_board.h); null for one process. The trainer
  // tells it each finished iteration.
  std::shared_ptr<ProgressBoard> progress;

  bool first_stage() const { return pp_rank == 0; }
  bool last_stage() const { return pp_rank == sizes.pp - 1; }
};

// A single process: every group is just this rank; no MPI or NCCL is touched.
ParallelState single_process_state();

// Builds the groups of `sizes` over `transport` (every rank calls this with the same sizes).
ParallelState build_parallel_state(std::shared_ptr<Transport> transport, const ParallelSizes& sizes, bool sequence_parallel);

// A communicator of one rank (all operations are local copies).
std::shared_ptr<Communicator> make_self_communicator(const std::string& name, int global_rank);

}  // namespace fp8tron
