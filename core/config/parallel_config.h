// How the job is spread over ranks: the launcher's view of the job, the rank grid's sizes, and
// the distributed-training switches (sequence parallelism, virtual stages, the distributed
// optimizer and its overlaps). parallel/ builds the groups from these.
#pragma once
#include <array>
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

// ---- tensor-parallel communication overlapped with the linear layers' GEMMs ----------------------
// (--tp-comm-overlap and its switches, --tp-comm-overlap-cfg, --use-ascend-mc2, --use-ascend-coc).
// The twelve GEMMs of a transformer layer that Transformer Engine names its userbuffers after:
// qkv and fc1 are column-parallel (all-gather of the sequence shards before the GEMM), proj and
// fc2 row-parallel (reduce-scatter after it); each has a forward (fprop), an input-gradient
// (dgrad) and a weight-gradient (wgrad) GEMM.
enum class TpGemm : uint8_t {
  kQkvFprop, kQkvDgrad, kQkvWgrad, kProjFprop, kProjDgrad, kProjWgrad,
  kFc1Fprop, kFc1Dgrad, kFc1Wgrad, kFc2Fprop, kFc2Dgrad, kFc2Wgrad,
};
constexpr size_t kNumTpGemms = 12;
const char* tp_gemm_name(TpGemm g);  // TE's userbuffer name: "qkv_fprop", ...

// How one GEMM's collective is overlapped (TE's `method`; Off: the plain blocking collective).
//   RingExchange  all-gather as a ring relay, one chunk per rank per step, each step's GEMM on the
//                 chunk already present; reduce-scatter by sending each destination's partial
//                 directly and summing in rank order at the end
//   Pipeline      reduce-scatter: the GEMM split along its output columns, each split's
//                 reduce-scatter issued as soon as it is computed; all-gather (MindSpeed CoC
//                 only): the local rows in pieces, each piece's all-gather under the GEMM of the
//                 previous one
//   Bulk          one collective under an independent GEMM (backward of qkv/fc1: the input's
//                 all-gather under dgrad, dgrad's reduce-scatter under wgrad)
//   External      proj/fc2 wgrad (TE's default): its operand comes with the dgrad ring
enum class OverlapMethod : uint8_t { kOff, kRingExchange, kPipeline, kBulk, kExternal };
const char* overlap_method_name(OverlapMethod m);  // TE's spelling: "ring_exchange", ...

struct GemmOverlap {
  OverlapMethod method = OverlapMethod::kOff;
  int num_splits = 4;      // Pipeline: output-column splits (reduce-scatter) or row pieces (CoC all-gather)
  bool aggregate = false;  // RingExchange all-gather: neighbours pair first, then a ring of pairs (TE)
  bool fp8_wire = false;   // FP8 on the wire: quantised before the all-gather / FP8 reduce-scatter partials
  // Hardware knobs of TE's userbuffers that fp8tron maps onto NCCL and cuBLASLt (docs/overlap.md):
  int num_sm = 16;             // SMs the communication may use (GEMM budget SMs - num_sm with sm_margin)
  bool sm_margin = false;      // cap the overlapped GEMM's SMs
  int cga_size = 2;            // NCCL cgaClusterSize of the overlap communicator
  bool use_ce = true;          // copy engines for p2p (fp8tron: NCCL p2p; noted at start-up)
  bool atomic_gemm = false;    // cuBLAS atomic GEMM (same math; ignored with a notice)
  int comm_priority = 0, gemm_priority = 0;  // stream priorities (fp8tron's comm streams are high priority)
  bool enabled() const { return method != OverlapMethod::kOff; }
};

enum class TpOverlapSource : uint8_t { kNone, kMegatron, kMc2, kCoc };

// The resolved per-GEMM plan (trainer/cli builds it: TE's defaults, the --tp-comm-overlap-cfg
// file, then the flags). Modules look their GEMMs up by name; disabled directions run the plain
// collectives with unchanged arithmetic.
struct TpOverlapConfig {
  TpOverlapSource source = TpOverlapSource::kNone;
  std::array<GemmOverlap, kNumTpGemms> gemms{};
  bool output_layer = false;  // --use-ascend-mc2: the output layer's all-gather pipelined too (MindSpeed)
  bool enabled() const { return source != TpOverlapSource::kNone; }
  const GemmOverlap& gemm(TpGemm g) const { return gemms[size_t(g)]; }
  GemmOverlap& gemm(TpGemm g) { return gemms[size_t(g)]; }
  std::string describe() const;  // one line: source and each GEMM's method
};

// Megatron-FSDP's --data-parallel-sharding-strategy (None: no --use-megatron-fsdp).
enum class DataParallelSharding { None, NoShard, Optim, OptimGrads, OptimGradsParams };

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
  bool average_in_collective = false;  // --ddp-average-in-collective
  bool distributed_optimizer = false;
  // --num-distributed-optimizer-instances: the data-parallel (x context-parallel) ranks form this
  // many consecutive blocks, each holding a whole copy of the distributed optimizer sharded over its
  // ranks (Megatron's partial distributed optimizer). 1: one copy over all of them.
  int optimizer_instances = 1;
  bool overlap_grad_reduce = false;
  bool overlap_param_gather = false;  // needs distributed_optimizer and overlap_grad_reduce (Megatron)
  // --overlap-param-gather-with-optimizer-step: the optimizer steps the first model chunk's
  // parameters first and issues their all-gather before it steps the rest (Megatron's rules: the
  // distributed optimizer, overlap_param_gather, an interleaved pipeline, --ckpt-format torch).
  bool overlap_param_gather_with_optimizer_step = false;
  // --use-megatron-fsdp (or --use-torch-fsdp2) with --data-parallel-sharding-strategy: what the
  // data-parallel ranks shard (docs/sharded_data_parallel.md). None: the flags above alone decide.
  DataParallelSharding dp_sharding = DataParallelSharding::None;
  // Optim: the distributed optimizer's state sharding with every gradient all-reduced (not
  // reduce-scattered onto its owner).
  bool all_reduce_sharded_grads() const { return dp_sharding == DataParallelSharding::Optim; }
  // OptimGradsParams (ZeRO-3): each rank keeps only its shard of the weights between uses.
  bool shard_params() const { return dp_sharding == DataParallelSharding::OptimGradsParams; }
  // OptimGrads and OptimGradsParams: each unit's gradients are reduce-scattered onto their owners
  // after each backward pass and freed (parallel/sharded_grads.h); no rank holds them all.
  bool shard_grads() const {
    return dp_sharding == DataParallelSharding::OptimGrads || dp_sharding == DataParallelSharding::OptimGradsParams;
  }
  // --torch-fsdp2-no-reshard-after-forward: a unit stays gathered from its forward pass to its
  // backward pass (FSDP2's reshard_after_forward=False).
  bool keep_params_after_forward = false;
  int64_t bucket_numel = 40000000;  // --ddp-bucket-size (Megatron: max(40M, 1M x dp) elements)
  int timeout_minutes = 10;      // --distributed-timeout-minutes: a collective that long ends the job
  int hang_report_seconds = 90;  // --hang-report-seconds: a collective that long is reported (parallel/hang_report.h)
  TpOverlapConfig tp_overlap;
  // Interleaved pipeline schedule: receives posted one step ahead so they overlap the compute
  // (Megatron's overlap_p2p_comm, on by default, forced off without virtual stages), and with
  // warmup_flush also in the warmup and cool-down phases.
  bool overlap_p2p = true;
  bool overlap_p2p_warmup_flush = false;
  // --defer-embedding-wgrad-compute / --wgrad-deferral-limit: the output layer's weight gradients
  // of the step's first `limit` micro-batches (0: all) are computed after the pipeline schedule
  // (models/linear/wgrad_deferral.h).
  bool defer_embedding_wgrad = false;
  int64_t wgrad_deferral_limit = 0;
};

}  // namespace fp8tron
