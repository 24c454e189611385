// How the job is spread over ranks: the launcher's view of the job, the rank grid's sizes, and
// the distributed-training switches (sequence parallelism, virtual stages, the distributed
// optimizer and its overlaps). parallel/ builds the groups from these.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace fp8tron {

// What the launcher tells a process about the job (parallel/launch_env.h reads it).
struct LaunchEnv {
  std::string launcher = "single process";  // "mpirun", "torchrun", "srun", "single process"
  int world_size = 1;
  int rank = 0;
  int local_rank = 0;
  int local_world_size = 1;
  std::string master_addr;  // torchrun / srun rendezvous
  int master_port = 0;
  bool agent_store = false;  // TORCHELASTIC_USE_AGENT_STORE=True: torchrun's agent hosts the store
};

// The sizes of the rank grid (parallel/topology.h forms the groups).
struct ParallelSizes {
  int world_size = 1;
  int tp = 1;   // tensor model parallel
  int cp = 1;   // context parallel
  int pp = 1;   // pipeline model parallel
  int ep = 1;   // expert model parallel
  int etp = 1;  // expert tensor parallel
  int dp = 1;   // data parallel (derived: world / (tp * cp * pp))
  int edp = 1;  // expert data parallel (derived: world / (etp * ep * pp))
  bool tp_pp_dp_order = false;  // --use-tp-pp-dp-mapping

  // Fills dp and edp from world_size; throws UserError naming the flags when sizes do not divide.
  static ParallelSizes derive(int world_size, int tp, int cp, int pp, int ep, int etp, bool tp_pp_dp_order);
  std::string order() const;         // "tp-cp-ep-dp-pp" or "tp-cp-ep-pp-dp"
  std::string describe() const;      // one line: "TP=2 CP=1 PP=2 DP=4 | experts: ETP=2 EP=1 EDP=8"
};

// How the model and its training are spread over ranks, beyond the rank grid itself.
struct DistributedConfig {
  bool sequence_parallel = false;
  int virtual_stages = 1;  // model chunks per pipeline rank (interleaved schedule when > 1)
  std::optional<int64_t> first_stage_layers, last_stage_layers;
  // --account-for-embedding-in-pipeline-split / --account-for-loss-in-pipeline-split: the embedding
  // (loss) counts as one layer when layers are split over the stages.
  bool account_for_embedding = false, account_for_loss = false;
  // --pipeline-model-parallel-layout, parsed: one string of E/t/m/L per virtual stage, in the order
  // Megatron lists them (virtual stage v of pipeline rank p is entry v x PP + p). Empty: none.
  std::vector<std::string> pipeline_layout;
  // Interleaved schedule: micro-batches run back to back per virtual stage
  // (--microbatch-group-size-per-virtual-pipeline-stage; 0 = the pipeline size).
  int64_t microbatch_group_size = 0;
  bool overlap_p2p = true;            // !--no-overlap-p2p-communication (only changes a VPP rule)
  bool average_in_collective = false;  // --ddp-average-in-collective
  bool distributed_optimizer = false;
  bool overlap_grad_reduce = false;
  bool overlap_param_gather = false;  // needs distributed_optimizer and overlap_grad_reduce (Megatron)
  int64_t bucket_numel = 40000000;  // --ddp-bucket-size (Megatron: max(40M, 1M x dp) elements)
  int timeout_minutes = 10;
};

}  // namespace fp8tron
