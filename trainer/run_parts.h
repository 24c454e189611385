// What one training run is made of, built once from the typed configuration: the device and its
// deterministic settings, the parallel groups, the model chunks of this pipeline rank, the FP8
// engine and the mixture-of-experts state they share, the optimizer, the pipeline schedule, the
// data loaders, the rerun engine and the optional pieces (the step's CUDA graph, the FP8 weight
// gather, the exposed-communication timers). build_run_parts() decides every one of them from the
// configuration; the loop (trainer.cpp), the step (training_step.h), checkpoints
// (run_checkpoints.h) and reports (run_reporter.h) only use them.
#pragma once
#include <torch/torch.h>

#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <vector>

#include "checkpoint/save_dir_lock.h"
#include "core/config/config.h"
#include "data/loader/batch_loader.h"
#include "fp8/fp8_linear.h"
#include "models/gpt_model.h"
#include "models/moe/moe_context.h"
#include "optim/mixed_precision_optimizer.h"
#include "parallel/all_to_all_turns.h"
#include "parallel/context_parallel.h"
#include "parallel/overlap/comm_timer.h"
#include "parallel/parallel_state.h"
#include "parallel/pipeline_schedule.h"
#include "rerun/rerun_state_machine.h"
#include "trainer/determinism.h"
#include "trainer/fp8_param_gather.h"
#include "trainer/logging/timers.h"
#include "trainer/numerics_guard.h"
#include "trainer/step_graph.h"
#include "trainer/trainer.h"

namespace fp8tron {

struct RunParts {
  explicit RunParts(const Config& c);
  RunParts(const RunParts&) = delete;
  RunParts& operator=(const RunParts&) = delete;

  const Config& config;
  torch::Device device;
  std::optional<DeterministicMode> deterministic;  // --deterministic-mode, for the whole run
  ParallelState parallel;
  // What gradients, the optimizer, checkpoints and FP8 amaxes see as data parallelism: the real
  // data-parallel group, or with context parallelism data x context parallel.
  ParallelState data_parallel;
  ContextParallelContext cp;
  std::vector<std::unique_ptr<checkpoint::SaveDirLock>> save_locks;  // rank 0: one job per --save
  std::shared_ptr<fp8::Fp8Engine> fp8;  // --fp8-format: every chunk's FP8 linears
  std::shared_ptr<MoeContext> moe;      // --num-experts: the chunks' MoE state
  // How the chunks' kernels treat the fp32 main gradients: gradient-accumulation fusion and the
  // wgrad GEMMs' first writes (models/linear/main_grads.h).
  MainGradsPtr main_grads;
  torch::Tensor expert_amax_slots;      // FP8 slots of expert sites (their own amax group)
  std::vector<GptModel> chunks;  // this pipeline rank's model chunks (virtual stages)
  std::unique_ptr<Fp8ParamGather> fp8_param_gather;  // --fp8-param-gather
  std::unique_ptr<MixedPrecisionOptimizer> optimizer;
  std::unique_ptr<PipelineSchedule> pipeline;
  std::unique_ptr<BatchLoader> train_loader, valid_loader;
  std::unique_ptr<StepGraph> step_graph;  // --cuda-graph-impl full_iteration
  // --timing-log-level >= 1: the exposed waits of tensor-parallel collectives and pipeline receives.
  std::shared_ptr<overlap::CommTimer> tp_comm_timer, pp_comm_timer;
  // --timing-log-level >= 1 with expert parallelism: the exposed waits of the expert-parallel
  // all-to-alls (what --overlap-moe-expert-parallel-comm hides).
  std::shared_ptr<overlap::CommTimer> ep_comm_timer;
  // --timing-log-level >= 1 with data parallelism: the exposed waits of the data-parallel groups'
  // operations (gradient reductions, the distributed optimizer's and Megatron-FSDP's parameter
  // all-gathers: what --overlap-grad-reduce and --overlap-param-gather hide). A data-parallel
  // group that shares its communicator with a group observed already (the expert-parallel one,
  // where it spans the data-parallel ranks) is timed by that group's timer instead.
  std::shared_ptr<overlap::CommTimer> dp_comm_timer;
  // --overlap-moe-expert-parallel-comm: the two micro-batches of the combined 1F1B schedule take
  // turns at the expert-parallel all-to-alls (parallel/combined_schedule.h).
  std::shared_ptr<AllToAllTurns> a2a_turns;
  // --delay-wgrad-compute: runs the weight gradients the backward pass holds (the model's queue,
  // main_grads->wgrad_queue()), timed as delayed-wgrad-compute (--timing-log-level 2). Called by
  // the expert-parallel group's observer before each turn and by the schedule after each backward
  // pass. Empty without the flag.
  std::function<void()> run_held_wgrads;
  std::unique_ptr<NumericsGuard> numerics;          // the values the rerun engine validates
  std::unique_ptr<rerun::RerunStateMachine> rerun;  // --rerun-mode: judges them
  std::set<int64_t> iterations_to_skip;             // --iterations-to-skip

  void synchronize() const;
  // Every chunk's buffers (the MoE routers' expert biases).
  std::vector<torch::Tensor> model_buffers() const;
  // For each flag, whether any rank of the job raised it (one all-reduce).
  std::vector<bool> any_rank(const std::vector<bool>& flags) const;
};

// Builds every part of the run (collective: every rank calls it). `timers` takes the MoE
// dispatcher's timings; options.force_single_process: single-process groups even under a
// launcher; options.main_grad_first_writes: off, every main gradient is zeroed before a step.
std::unique_ptr<RunParts> build_run_parts(const Config& c, const TrainOptions& options, Timers& timers);

// The dtype of the model's parameters (--bf16, --fp16, or fp32).
torch::Dtype param_dtype(const Config& c);

}  // namespace fp8tron
