#include "trainer/trainer.h"

#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <sys/resource.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <sstream>

#include "core/config/batch_schedule.h"
#include "core/error.h"
#include "core/log.h"
#include "core/text.h"
#include "data/loader/batch_loader.h"
#include "data/loader/builtin_datasets.h"
#include "data/loader/cyclic_source.h"
#include "data/loader/file_source.h"
#include "fp8/fp8_linear.h"
#include "fp8/wgrad_fusion.h"
#include "models/gpt_model.h"
#include "models/linear/main_grad_first_write.h"
#include "models/linear/modules.h"
#include "parallel/context_parallel.h"
#include "parallel/layer_split.h"
#include "parallel/overlap/comm_timer.h"
#include "parallel/pipeline_schedule.h"
#include "trainer/cli/config_builder.h"
#include "checkpoint/async_saver.h"
#include "checkpoint/load.h"
#include "checkpoint/save.h"
#include "trainer/determinism.h"
#include "trainer/exit_signal.h"
#include "trainer/fp8_param_gather.h"
#include "trainer/profiling.h"
#include "trainer/logging/iteration_log.h"
#include "optim/loss_scaler.h"
#include "optim/lr_schedule.h"
#include "optim/mixed_precision_optimizer.h"
#include "trainer/weight_hash_check.h"
#include "trainer/cli/model_math.h"
#include "trainer/cli/tp_overlap_args.h"
#include "trainer/logging/tensorboard_writer.h"
#include "trainer/logging/timers.h"
#include "checkpoint/fault_points.h"
#include "checkpoint/rank_agreement.h"
#include "checkpoint/save_dir_lock.h"
#include "trainer/numerics_guard.h"
#include "trainer/moe_metrics.h"
#include "rerun/rerun_state_machine.h"
#include "trainer/step_graph.h"
#include "trainer/step_snapshot.h"

namespace fp8tron {

bool cuda_available() { return torch::cuda::is_available(); }

ParallelState make_parallel_state(const Config& c, bool force_single_process) {
  if (force_single_process || c.parallel.world_size == 1) return single_process_state();
  const CommTimeouts timeout{std::chrono::minutes(c.distributed.timeout_minutes),
                             std::chrono::seconds(c.distributed.hang_report_seconds)};
  if (c.device == "cuda") {
    const int devices = std::max(1, int(torch::cuda::device_count()));
    return build_parallel_state(make_nccl_transport(c.launch, c.launch.local_rank % devices, timeout), c.parallel,
                                c.distributed.sequence_parallel);
  }
  if (c.launch.launcher != "mpirun")
    throw UserError("multi-process CPU runs use MPI: launch with mpirun (got " + c.launch.launcher + ")");
  return build_parallel_state(make_mpi_transport(timeout), c.parallel, c.distributed.sequence_parallel);
}

namespace {

using Clock = std::chrono::steady_clock;

std::string value_text(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return strprintf("%.6E", v);
}

torch::Dtype param_dtype(const Config& c) {
  return c.precision.params_dtype == ParamDtype::Bf16 ? torch::kBFloat16
         : c.precision.params_dtype == ParamDtype::Fp16 ? torch::kFloat16 : torch::kFloat32;
}

std::string memory_report(const torch::Device& device, int64_t iteration) {
  if (device.is_cuda()) {
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device.index());
    const auto agg = size_t(c10::CachingAllocator::StatType::AGGREGATE);
    const double mb = 1024.0 * 1024.0;
    return strprintf("[Rank %d] (after %lld iterations) memory (MB) | allocated: %.1f | max allocated: %.1f | "
                     "reserved: %.1f | max reserved: %.1f",
                     log::rank(), (long long)iteration, stats.allocated_bytes[agg].current / mb,
                     stats.allocated_bytes[agg].peak / mb, stats.reserved_bytes[agg].current / mb,
                     stats.reserved_bytes[agg].peak / mb);
  }
  struct rusage usage {};
  getrusage(RUSAGE_SELF, &usage);
  return strprintf("[Rank %d] (after %lld iterations) memory (MB) | host max resident: %.1f", log::rank(),
                   (long long)iteration, usage.ru_maxrss / 1024.0);
}

std::shared_ptr<SampleSource> make_source(const Config& c) {
  switch (c.data.source) {
    case DataSource::Mock: return make_mock_source(c.model.seq_length, c.model.vocab_size, c.data.eod, c.training.seed);
    case DataSource::Builtin: return make_builtin_source(c.model.seq_length, c.model.vocab_size, c.training.seed);
    case DataSource::Files: {
      const auto& t = c.training;
      FileSourceSizes sizes{megatron_split_samples(t.train_iters, t.train_samples, t.global_batch_size, t.eval_interval,
                                                   t.eval_iters, t.start_eval_at_iter),
                            c.model.seq_length, t.seed};
      return make_file_source(c.data, sizes);
    }
  }
  FP8TRON_CHECK(false, "unknown data source");
}

// Running sums over a log interval, kept on the device so the loop never waits for the GPU.
struct IntervalStats {
  torch::Tensor loss_sum, loss_count, skipped, nan;
  torch::Tensor mtp_loss_sums;  // [D]: each MTP depth's loss summed over the interval's steps
  // MoE losses (load_balancing_loss, z_loss, ...) summed over the interval's iterations, in the
  // order they first appeared (Megatron's total_loss_dict).
  std::vector<std::pair<std::string, torch::Tensor>> moe_sums;
  void reset(const torch::Device& d, int64_t mtp_layers) {
    auto z = torch::zeros({}, torch::TensorOptions().device(d).dtype(torch::kFloat32));
    loss_sum = z.clone(); loss_count = z.clone(); skipped = z.clone(); nan = z.clone();
    mtp_loss_sums = torch::zeros({mtp_layers}, z.options());
    for (auto& [name, sum] : moe_sums) sum = z.clone();
  }
  void add_moe(const std::string& name, const torch::Tensor& value) {
    for (auto& [n, sum] : moe_sums)
      if (n == name) {
        sum = sum + value;
        return;
      }
    moe_sums.emplace_back(name, value.clone());
  }
};

class Trainer {
 public:
  Trainer(const Config& c, const TrainOptions& options)
      : c_(c),
        options_(options),
        device_(c.device == "cuda" ? torch::Device(torch::kCUDA, c.launch.local_rank % std::max(1, int(torch::cuda::device_count())))
                                   : torch::Device(torch::kCPU)),
        schedule_(c.lr_schedule),
        batches_(BatchSchedule::of(c.training, c.parallel.dp)),
        scaler_(c.precision),
        timers_(c.logging.timing_log_level, [this] { synchronize(); }) {}
  ~Trainer() { main_grad_first_write::own({}); }  // the registry holds this run's parameters

  TrainResult run();

 private:
  void synchronize() const { if (device_.is_cuda()) torch::cuda::synchronize(device_.index()); }
  void build();
  // Micro-batch `micro_batch` of the batch that starts at `first_sample`, this rank's part of it
  // (Megatron's sampler and context-parallel shard), on the device.
  Batch load_micro_batch(BatchLoader& loader, int64_t micro_batch, int64_t first_sample);
  // One chunk's forward of a micro-batch; `batch` gives the micro-batch when the stage reads it.
  // `loss_tokens` (--calculate-per-token-loss): the loss stage adds its micro-batch's loss-token count.
  using BatchOf = std::function<Batch()>;
  torch::Tensor forward_chunk(int chunk, const torch::Tensor& input, const BatchOf& batch,
                              torch::Tensor* loss_tokens = nullptr);
  // The step's forward and backward passes over every micro-batch through the pipeline schedule:
  // the sum of their losses (the loss stage adds their loss-token counts to `loss_tokens`).
  torch::Tensor run_micro_batches(int64_t micro_batches, double backward_scale,
                                  const std::function<Batch(int64_t)>& batch_of, torch::Tensor* loss_tokens);
  // Mean loss of a global batch of `micro_batches`, averaged over micro-batches and data-parallel
  // ranks (all ranks); with --calculate-per-token-loss the summed loss over the global token count.
  torch::Tensor average_loss(torch::Tensor loss_sum, int64_t micro_batches, const torch::Tensor& loss_tokens) const;
  // The sum of a per-rank count over the pipeline (held by the last stage) and data-parallel ranks.
  torch::Tensor global_token_count(torch::Tensor local) const;
  // Each MTP depth's loss of the step, averaged as Megatron logs it (added to the interval once the
  // step is accepted).
  torch::Tensor mtp_losses(int64_t micro_batches);
  // --rampup-batch-size: announces a new batch size and saves a checkpoint when the micro-batch
  // count grows (Megatron's train loop).
  void update_batch_size(int64_t iteration);
  torch::Tensor train_step(int64_t iteration);
  // One pass of an iteration: the forward and backward passes over every micro-batch, the gradient
  // reductions, the FP8 scale update, up to the gradient norm before the update. The rerun engine
  // may run it again from the state captured before the first pass.
  struct Pass {
    torch::Tensor loss, mtp;
    PreparedStep prepared;
  };
  Pass forward_backward(int64_t iteration);
  StepResult apply_step(Pass& pass, const torch::Tensor& skip);
  // The step's counters, schedule and logged sums, once the rerun engine accepted `pass`.
  void account_step(const Pass& pass);
  // The rerun engine's decision to end the run (throws): the one-line fatal stop of --rerun-mode
  // disabled, or Megatron's exit 16/17, saving the state before the iteration first when asked.
  [[noreturn]] void end_run(int64_t iteration, const rerun::PassOutcome& outcome, const StepSnapshot* snapshot,
                            double loss, double grad_norm);
  // --iterations-to-skip: the iteration's samples are consumed without a step (Megatron's
  // dummy_train_step).
  void skip_iteration(int64_t iteration);
  std::vector<torch::Tensor> model_buffers();
  std::vector<bool> any_rank(const std::vector<bool>& flags);
  void build_rerun_engine();
  void build_context_parallel();  // groups and the data-parallel view (collective)
  void lock_save_dirs();
  std::string first_nonfinite_grad_everywhere();
  void inject_nan_gradient();
  bool fp8_stats_due(int64_t iteration) const;
  void log_fp8_stats(int64_t iteration);
  void end_fp8_step();
  // The gradients the wgrad GEMMs write in a step's first backward leave the optimizer's zeroing.
  void skip_zeroing_gemm_written_grads();
  void log_tp_overlap() const;
  void report_moe(int64_t iteration);
  void log_moe_layout();
  MoeContext* moe() const { return moe_.get(); }
  double evaluate();
  void log_interval(int64_t iteration, double seconds, int64_t iterations_in_interval);
  void write_tensorboard(int64_t iteration, const torch::Tensor& loss);
  Timers::Report timer_report(double iterations);
  bool evaluation_due(int64_t iteration) const;
  void check_weight_hashes_across_replicas(int64_t iteration);
  void write_validation_tensorboard(int64_t iteration, double loss);
  std::map<std::string, torch::Tensor> global_weights(std::vector<double>* sample = nullptr);
  TrainingState checkpoint_state();
  void save(int64_t iteration, bool non_persistent = false);
  bool checkpoint_and_decide_exit(int64_t iteration, Clock::time_point start, const ExitSignalHandler* signal);

  const Config& c_;
  TrainOptions options_;
  torch::Device device_;
  ParallelState parallel_;
  // What gradients, the optimizer, checkpoints and FP8 amaxes see as data parallelism: the real
  // data-parallel group, or with context parallelism data x context parallel.
  ParallelState data_parallel_;
  ContextParallelContext cp_;
  std::vector<GptModel> chunks_;
  std::unique_ptr<MixedPrecisionOptimizer> optimizer_;
  std::unique_ptr<PipelineSchedule> pipeline_;
  LrSchedule schedule_;
  BatchSchedule batches_;
  int64_t micro_batches_ = 0;        // of the current step
  int64_t current_global_batch_ = 0;  // the global batch size Megatron reports for the current step
  LossScaler scaler_;
  Timers timers_;
  std::unique_ptr<BatchLoader> train_loader_, valid_loader_;
  std::unique_ptr<TensorBoardWriter> tensorboard_;
  IntervalStats interval_;
  StepResult last_step_;
  int64_t consumed_train_samples_ = 0, consumed_valid_samples_ = 0;
  int64_t last_saved_iteration_ = -1;
  std::unique_ptr<AsyncCheckpointSaver> async_saver_;  // --async-save
  std::shared_ptr<fp8::Fp8Engine> fp8_;                // --fp8-format: every chunk's FP8 linears
  std::shared_ptr<MoeContext> moe_;                    // --num-experts: the chunks' MoE state
  torch::Tensor expert_amax_slots_;                    // FP8 slots of expert sites (their own amax group)
  std::map<std::string, std::vector<torch::Tensor>> moe_history_;  // MoE losses per iteration (TrainResult)
  std::vector<torch::Tensor> mtp_history_;  // [D] MTP losses per iteration (TrainResult)
  std::optional<DeterministicMode> deterministic_;     // --deterministic-mode, for the whole run
  std::unique_ptr<NumericsGuard> numerics_;            // the values the rerun engine validates
  std::unique_ptr<rerun::RerunStateMachine> rerun_;    // --rerun-mode: judges them
  RerunCheckpointIo rerun_io_;                         // its record, into and out of checkpoints
  std::set<int64_t> iterations_to_skip_;               // --iterations-to-skip
  int64_t skipped_train_samples_ = 0;
  std::vector<std::unique_ptr<checkpoint::SaveDirLock>> save_locks_;  // rank 0: one job per --save
  int64_t iteration_ = 0;                              // the iteration train_step() runs
  std::shared_ptr<overlap::CommTimer> tp_comm_timer_;  // --timing-log-level >= 1 with TP: exposed TP communication
  std::shared_ptr<overlap::CommTimer> pp_comm_timer_;  // ... with PP: exposed pipeline receives
  std::unique_ptr<Fp8ParamGather> fp8_param_gather_;   // --fp8-param-gather
  std::unique_ptr<StepGraph> step_graph_;              // --cuda-graph-impl full_iteration
};

void Trainer::build() {
  if (device_.is_cuda()) {
    c10::cuda::set_device(device_.index());
    configure_attention_backends();
  }
  // Before the first NCCL communicator and cuBLAS handle: it sets the environment they read.
  if (c_.training.deterministic) deterministic_.emplace(device_);
  parallel_ = make_parallel_state(c_, options_.force_single_process);
  lock_save_dirs();
  torch::manual_seed(c_.training.seed + 100 * uint64_t(parallel_.pp_rank));  // dropout streams, as Megatron seeds them
  TensorParallelContext tp{parallel_.tp, parallel_.tp_rank, parallel_.sizes.tp, parallel_.sequence_parallel};
  build_context_parallel();
  if (c_.distributed.tp_overlap.enabled()) tp.overlap = std::make_shared<TpOverlapConfig>(c_.distributed.tp_overlap);
  if (timers_.enabled(1) && parallel_.sizes.tp > 1) {
    tp_comm_timer_ = std::make_shared<overlap::CommTimer>(device_.is_cuda());
    parallel_.tp->set_wait_observer(tp_comm_timer_);
  }
  const auto& d = c_.distributed;
  const auto chunks = plan_pipeline_chunks(pipeline_split(c_), parallel_.pp_rank);
  if (c_.precision.fp8.enabled()) {
    const Fp8Config& f = c_.precision.fp8;
    fp8::Fp8EngineOptions o{*f.recipe, f.min_features, f.bf16_first_layers, f.bf16_last_layers, c_.model.num_layers,
                            c_.training.deterministic};
    fp8_ = std::make_shared<fp8::Fp8Engine>(o, device_);
  }
  if (c_.model.moe.enabled()) {
    ExpertParallelGroups g{parallel_.ep, parallel_.expert_tp, parallel_.expert_tp_ep, parallel_.tp_cp, parallel_.tp_dp_cp,
                           parallel_.ep_rank, parallel_.expert_tp_rank};
    moe_ = std::make_shared<MoeContext>(c_.model.moe, moe_metric_layers(c_.model), std::move(g));
    moe_->set_timer([this](const char* name, bool start) {
      if (start) timers_.start(name, 2);
      else timers_.stop(name, 2);
    });
  }
  std::vector<NamedParam> params;
  for (const ChunkPlan& plan : chunks) {
    StageSpec spec{plan.first_layer, plan.num_layers, plan.embedding, plan.loss};
    // Weights are drawn on the CPU in fp32 from (seed, name): every layout and device starts from
    // the same global weights; then they move to the device and the optimizer casts them.
    GptModel chunk(c_.model, tp, spec, fp8_, moe_, cp_);
    chunk->to(device_);
    chunk->train();
    chunk->set_per_token_loss(c_.training.calculate_per_token_loss);
    const auto infos = chunk->param_infos();
    for (const auto& item : chunk->named_parameters()) params.push_back({item.key(), item.value(), infos.at(item.key())});
    chunks_.push_back(chunk);
  }
  std::vector<torch::Tensor> byte_params;
  if (fp8_ && c_.precision.fp8.param_gather && fp8_->num_sites() > 0) {
    fp8_param_gather_ = std::make_unique<Fp8ParamGather>(fp8_, data_parallel_);
    byte_params = fp8_param_gather_->params();
  }
  optimizer_ = std::make_unique<MixedPrecisionOptimizer>(params, c_.optimizer, c_.precision, data_parallel_, d.distributed_optimizer,
                                                         c_.model.moe.enabled(), byte_params);
  if (fp8_param_gather_) optimizer_->enable_byte_publish(fp8_param_gather_->publish(*optimizer_));
  const ModelConfig& m = c_.model;
  optimizer_->count_zeros(c_.logging.log_num_zeros_in_grad);
  optimizer_->set_qkv_rows({m.num_attention_heads / m.num_query_groups * m.kv_channels, m.kv_channels, m.kv_channels});
  if (d.overlap_grad_reduce) optimizer_->enable_grad_overlap(d.bucket_numel);
  set_gradient_accumulation_fusion(c_.precision.gradient_accumulation_fusion);
  skip_zeroing_gemm_written_grads();
  if (d.overlap_param_gather) optimizer_->enable_param_gather_overlap(d.bucket_numel);
  if (optimizer_->param_gather_overlapped()) {
    MixedPrecisionOptimizer* optimizer = optimizer_.get();
    for (auto& chunk : chunks_)
      chunk->set_params_ready_hook([optimizer](const torch::nn::Module& part) { optimizer->wait_for_params(part); });
  }
  const int64_t s = c_.model.seq_length / parallel_.sizes.cp / (parallel_.sequence_parallel ? parallel_.sizes.tp : 1);
  pipeline_ = std::make_unique<PipelineSchedule>(parallel_, d.virtual_stages,
                                                 std::vector<int64_t>{s, c_.training.micro_batch_size, c_.model.hidden_size},
                                                 param_dtype(c_), device_,
                                                 PipelineOverlap{d.overlap_p2p, d.overlap_p2p_warmup_flush});
  if (timers_.enabled(1) && parallel_.sizes.pp > 1) {
    // The stall of the pipeline's receives (what --overlap-p2p-communication hides).
    pp_comm_timer_ = std::make_shared<overlap::CommTimer>(device_.is_cuda());
    for (auto* senders : {&parallel_.forward_senders, &parallel_.backward_senders})
      for (auto& comm : *senders) comm->set_wait_observer(pp_comm_timer_);
  }
  std::shared_ptr<SampleSource> source = make_source(c_);
  if (c_.data.dataloader_type == DataloaderType::Cyclic) {
    // Sized as the files are, or (built-in and mock data) as Megatron sizes the splits.
    const auto& t = c_.training;
    const auto sizes = megatron_split_samples(t.train_iters, t.train_samples, t.global_batch_size, t.eval_interval,
                                              t.eval_iters, t.start_eval_at_iter);
    source = std::make_shared<CyclicSource>(source, sizes, t.micro_batch_size, parallel_.sizes.dp, c_.data.data_sharding);
  }
  BatchOptions batch;
  batch.seq_length = c_.model.seq_length;
  batch.micro_batch_size = c_.training.micro_batch_size;
  batch.eod = c_.data.eod;
  batch.eod_mask_loss = c_.data.eod_mask_loss;
  batch.reset_position_ids = c_.data.reset_position_ids;
  batch.reset_attention_mask = c_.data.reset_attention_mask;
  batch.pad = c_.data.pad;
  batch.create_attention_mask = c_.data.create_attention_mask;
  batch.prefetch = c_.data.num_workers;
  batch.stride = c_.training.micro_batch_size * parallel_.sizes.dp;
  batch.vocab_size = c_.model.vocab_size;
  train_loader_ = std::make_unique<BatchLoader>(source, Split::Train, batch, device_);
  valid_loader_ = std::make_unique<BatchLoader>(source, Split::Valid, batch, device_);
  if (c_.training.eval_iters > 0 && !valid_loader_->has_data()) log::info(" > no validation data: evaluation is skipped");
  if (!c_.logging.tensorboard_dir.empty() && log::rank() == 0)
    tensorboard_ = std::make_unique<TensorBoardWriter>(c_.logging.tensorboard_dir);

  log::print(strprintf(" > number of parameters on (tensor, pipeline) model parallel rank (%d, %d): %lld", parallel_.tp_rank,
                      parallel_.pp_rank, (long long)optimizer_->num_parameters()));
  const std::string backend = attention_backend_name(c_.model, c_.training.micro_batch_size, device_, param_dtype(c_));
  if (device_.is_cuda() && c_.training.deterministic) {
    log::info(" > attention: " + backend + " with its deterministic backward (--deterministic-mode)");
  } else {
    log::info(" > attention: " + backend);
    if (device_.is_cuda() && backend != "cuDNN fused attention")
      log::warning("cuDNN attention is not available for these shapes/settings; using " + backend);
  }
  if (fp8_) log::info(" > " + fp8_->describe());
  if (c_.training.cuda_graph.full_iteration) {
    step_graph_ = std::make_unique<StepGraph>(c_.training.cuda_graph.warmup_steps, device_);
    log::info(strprintf(" > CUDA graph: each step's forward and backward passes run as one graph, captured after %lld "
                        "eager steps (--cuda-graph-impl full_iteration)",
                        (long long)c_.training.cuda_graph.warmup_steps));
  }
  log_tp_overlap();
  if (moe_) log_moe_layout();
  interval_.reset(device_, c_.model.mtp.num_layers);
  const auto& t = c_.training;
  if (t.rampup) {
    // Megatron's messages (sic: no space in "batchsize").
    log::info(strprintf("will use batch size rampup starting from global batch size %lld to global batch size %lld with "
                        "batchsize increments %lld over %lld samples.",
                        (long long)t.rampup->start, (long long)t.global_batch_size, (long long)t.rampup->increment,
                        (long long)t.rampup->samples));
  }
  if (!t.step_batch_schedule.empty()) {  // Megatron's StepBatchsizeNumMicroBatchesCalculator messages
    const int64_t micro_dp = t.micro_batch_size * parallel_.sizes.dp;
    log::info("> initializing step batch size schedule");
    log::info(strprintf("  seq_length: %lld (thresholds interpreted as tokens)", (long long)c_.model.seq_length));
    log::info(strprintf("step batch size schedule (%zu steps):", t.step_batch_schedule.size()));
    for (const auto& [threshold, batch] : t.step_batch_schedule)
      log::info(strprintf("  >= %lld tokens (%lld samples) -> batch_size=%lld, num_microbatches=%lld",
                          (long long)(threshold * c_.model.seq_length), (long long)threshold, (long long)batch,
                          (long long)(batch / micro_dp)));
  }
  if (t.train_samples) log::print(strprintf("setting training iterations to %lld", (long long)t.train_iters));
  numerics_ = std::make_unique<NumericsGuard>(device_);
  build_rerun_engine();
  iterations_to_skip_.insert(t.iterations_to_skip.begin(), t.iterations_to_skip.end());
  if (!iterations_to_skip_.empty())
    log::info(" > iterations to skip (--iterations-to-skip, --result-rejected-tracker-filename): " +
              join([&] {
                std::vector<std::string> v;
                for (int64_t i : iterations_to_skip_) v.push_back(std::to_string(i));
                return v;
              }(), ", "));
}

void Trainer::build_rerun_engine() {
  const RerunConfig& r = c_.training.rerun;
  std::string node = r.test_node_name;
  if (node.empty()) {
    char host[256] = {};
    gethostname(host, sizeof host - 1);
    node = host;
  }
  rerun::Hardware hardware{node, device_.is_cuda() ? int(device_.index()) : -1};
  rerun_ = std::make_unique<rerun::RerunStateMachine>(
      r, rerun::validation_calls(c_.training.numerics), parallel_.world_rank, parallel_.sizes.world_size, hardware,
      c_.training.seed, !c_.checkpoint.save.empty(), [this](const std::vector<bool>& flags) { return any_rank(flags); });
}

std::vector<bool> Trainer::any_rank(const std::vector<bool>& flags) {
  if (parallel_.sizes.world_size == 1) return flags;
  std::vector<float> values(flags.begin(), flags.end());
  auto t = torch::tensor(values, torch::kFloat32).to(device_);
  parallel_.world->all_reduce(t, ReduceOp::Max);
  t = t.cpu();
  std::vector<bool> out;
  for (int64_t i = 0; i < t.numel(); ++i) out.push_back(t[i].item<float>() > 0);
  return out;
}

std::vector<torch::Tensor> Trainer::model_buffers() {
  std::vector<torch::Tensor> out;
  for (auto& chunk : chunks_)
    for (const auto& item : chunk->named_buffers()) out.push_back(item.value());
  return out;
}

// One job per save directory (checkpoint/save_dir_lock.h): rank 0 holds the locks of --save (and
// of a separate --non-persistent-global-ckpt-dir); every rank stops with rank 0's refusal.
void Trainer::lock_save_dirs() {
  const auto& k = c_.checkpoint;
  if (k.save.empty()) return;
  std::vector<std::string> dirs = {k.save};
  if (k.non_persistent_save_interval && !k.non_persistent_dir.empty()) dirs.push_back(k.non_persistent_dir);
  std::string error;
  if (parallel_.world_rank == 0) {
    try {
      for (const auto& dir : dirs) {
        auto lock = checkpoint::SaveDirLock::acquire(dir);
        if (!lock->taken_over().empty())
          log::info(" > " + lock->path() + ": taking over the lock of a job that is gone (" + lock->taken_over() + ")");
        save_locks_.push_back(std::move(lock));
      }
    } catch (const UserError& e) {
      error = e.what();
      save_locks_.clear();
    }
  }
  const std::string refusal = all_gather_strings(parallel_, device_, error).front();
  if (!refusal.empty()) throw UserError(refusal);
}

// The resolved overlap plan and how it maps onto this machine, once.
void Trainer::log_tp_overlap() const {
  const auto& plan = c_.distributed.tp_overlap;
  if (!plan.enabled()) return;
  log::info(" > " + plan.describe());
  const std::string ascend = ascend_mapping_notice(plan);
  if (!ascend.empty()) log::info(" > " + ascend);
  if (device_.is_cuda()) {
    log::info(" > tensor-parallel overlap transport: NCCL point-to-point and collectives on the group's own stream; "
              "NVLink multicast is not used");
    if (!fp8_)
      log::info(" > the overlapped linears' bf16 GEMMs run through ATen (cuBLAS) without an SM budget: "
                "set_sm_margin applies to FP8 GEMMs");
  }
}

void Trainer::build_context_parallel() {
  data_parallel_ = parallel_;
  if (parallel_.sizes.cp == 1) return;
  // The hierarchical levels exist for a2a+p2p layers only (Megatron creates them regardless).
  bool hierarchical = false;
  for (CpCommType t : c_.context_parallel.comm_types) hierarchical = hierarchical || t == CpCommType::A2AP2P;
  const auto groups = build_context_parallel_groups(
      parallel_, hierarchical ? c_.context_parallel.hierarchical_sizes : std::vector<int>{});
  cp_ = ContextParallelContext{c_.context_parallel, parallel_.cp, groups.a2a_level, groups.p2p_level};
  data_parallel_ = with_context_parallel_in_data_parallel(parallel_, groups.dp_cp);
}

void Trainer::log_moe_layout() {
  const auto& m = c_.model.moe;
  const ParallelSizes& z = parallel_.sizes;
  log::info(strprintf(" > mixture of experts: %lld of %lld layers, %lld experts (%lld per expert-parallel rank), top-%lld, "
                      "%s dispatcher; experts' gradients reduced over the expert data-parallel group (%d ranks)",
                      (long long)m.num_moe_layers(), (long long)c_.model.num_layers, (long long)m.num_experts,
                      (long long)(m.num_experts / z.ep), (long long)m.topk,
                      m.dispatcher == MoeDispatcher::kAllToAll ? "alltoall" : "allgather", z.edp));
  if (fp8_ && m.expert_gemm_fp8)
    log::info(" > FP8 experts: each expert's amaxes are reduced over the ranks holding that expert (expert tensor x "
              "expert data parallel), so an expert's scales do not depend on the expert-parallel layout");
  if (fp8_) {
    // The expert sites' slots of the delayed-scaling state, reduced over their own group.
    const OptimizerDomain& experts = *optimizer_->domains().back();
    std::vector<int64_t> slots;
    for (const auto& site : fp8_->sites())
      if (experts.holds(site->parameter))
        for (auto role : {fp8::TensorRole::kInput, fp8::TensorRole::kWeight, fp8::TensorRole::kOutput,
                          fp8::TensorRole::kGradOutput, fp8::TensorRole::kGradInput})
          slots.push_back(int64_t(fp8_->slot(*site, role)));
    if (!slots.empty()) expert_amax_slots_ = torch::tensor(slots, torch::kInt64).to(device_);
  }
}

void Trainer::end_fp8_step() {
  // Megatron's amax reduction group: tensor x data parallel (x context parallel), or with
  // --tp-only-amax-red the tensor-parallel group only, so every rank of a stage shares scales.
  // Expert sites: over the ranks holding the same expert (expert tensor x expert data parallel),
  // not slot by slot over ranks that hold different experts at the same place. Dense sites: over
  // data (x context) parallel.
  const bool over_dp = data_parallel_.sizes.dp > 1 && !c_.precision.fp8.tp_only_amax_reduction;
  const bool over_edp = parallel_.sizes.edp > 1 && !c_.precision.fp8.tp_only_amax_reduction;
  fp8_->end_step([&](torch::Tensor& amaxes) {
    torch::Tensor experts;
    if (expert_amax_slots_.defined()) experts = amaxes.index_select(0, expert_amax_slots_);
    if (parallel_.sizes.tp > 1) parallel_.tp->all_reduce(amaxes, ReduceOp::Max);
    if (over_dp) data_parallel_.dp->all_reduce(amaxes, ReduceOp::Max);
    if (!experts.defined()) return;
    if (parallel_.sizes.etp > 1) parallel_.expert_tp->all_reduce(experts, ReduceOp::Max);
    if (over_edp) parallel_.expert_dp->all_reduce(experts, ReduceOp::Max);
    amaxes.index_copy_(0, expert_amax_slots_, experts);
  });
}

Batch Trainer::load_micro_batch(BatchLoader& loader, int64_t micro_batch, int64_t first_sample) {
  // Megatron's sampler: micro-batch m of data-parallel rank r starts at m*mbs*dp + r*mbs.
  const int64_t mbs = c_.training.micro_batch_size;
  const int64_t sample = first_sample + micro_batch * mbs * parallel_.sizes.dp + parallel_.dp_rank * mbs;
  timers_.start("batch-generator", 2);
  Batch batch = loader.load(sample);
  // Megatron's get_batch_on_this_cp_rank: every context-parallel rank loads the micro-batch and
  // keeps its shard of the sequence.
  if (cp_.enabled())
    for (torch::Tensor* t : {&batch.tokens, &batch.labels, &batch.loss_mask, &batch.position_ids, &batch.segment_ids})
      if (t->defined()) *t = cp_shard(*t, 1, cp_.size(), cp_.rank());
  timers_.stop("batch-generator", 2);
  return batch;
}

torch::Tensor Trainer::forward_chunk(int chunk, const torch::Tensor& input, const BatchOf& batch_of,
                                     torch::Tensor* loss_tokens) {
  auto& model = chunks_[size_t(chunk)];
  const StageSpec& stage = model->stage();
  // Middle stages need the batch only for the document mask of --reset-attention-mask.
  const bool document_mask = c_.data.reset_attention_mask && c_.data.create_attention_mask;
  if (!stage.has_embedding && !stage.has_head && !document_mask) return model->forward_stage(input, {}, {});
  const Batch batch = batch_of();
  if (stage.has_head && loss_tokens) *loss_tokens += batch.loss_mask.sum();
  torch::Tensor out = model->forward_stage(stage.has_embedding ? batch.tokens : input, batch.labels, batch.loss_mask,
                                           batch.position_ids, batch.segment_ids, batch.tokens);
  const NumericsChecks& n = c_.training.numerics;
  if (stage.has_head && model->is_training() && n.test_nan_iteration == iteration_ && n.test_nan_param.empty())
    out = out * std::nan("");  // --fp8tron-test-inject-nan ITER: a NaN loss, and so NaN gradients
  return out;
}

torch::Tensor Trainer::run_micro_batches(int64_t micro_batches, double backward_scale,
                                         const std::function<Batch(int64_t)>& batch_of, torch::Tensor* loss_tokens) {
  return pipeline_->run(
      micro_batches,
      [&](int chunk, int64_t mb, const torch::Tensor& input) {
        return forward_chunk(chunk, input, [&] { return batch_of(mb); }, loss_tokens);
      },
      backward_scale, [&] { optimizer_->arm_grad_overlap(); }, c_.distributed.microbatch_group_size);
}

torch::Tensor Trainer::average_loss(torch::Tensor loss_sum, int64_t micro_batches, const torch::Tensor& loss_tokens) const {
  if (parallel_.sizes.pp > 1) parallel_.pp->all_reduce(loss_sum);  // only the last stage holds it
  // Context-parallel ranks hold parts of each micro-batch's loss: summed with the replicas.
  if (data_parallel_.sizes.dp > 1) data_parallel_.dp->all_reduce(loss_sum);
  // pretrain_gpt.py's per-token loss: summed losses over summed loss tokens.
  if (c_.training.calculate_per_token_loss) return loss_sum / loss_tokens.clamp_min(1.0);
  return loss_sum / double(micro_batches * parallel_.sizes.dp);
}

torch::Tensor Trainer::global_token_count(torch::Tensor local) const {
  if (parallel_.sizes.pp > 1) parallel_.pp->all_reduce(local);  // only the last stage counts
  // Over data x context parallel: each context-parallel rank counts its own shard's tokens.
  if (data_parallel_.sizes.dp > 1) data_parallel_.dp->all_reduce(local);
  return local;
}

torch::Tensor Trainer::mtp_losses(int64_t micro_batches) {
  const int64_t depths = c_.model.mtp.num_layers;
  if (depths == 0) return {};
  // Megatron's MTP loss logging: each depth's per-micro-batch loss, over micro-batches, averaged
  // over data-parallel ranks; only the loss stage has them (summed over the pipeline group).
  // Context-parallel ranks hold parts of each micro-batch's loss: summed with the replicas.
  auto values = torch::zeros({depths}, torch::TensorOptions().device(device_).dtype(torch::kFloat32));
  for (auto& chunk : chunks_) {
    int64_t n = 0;
    auto sums = chunk->take_mtp_losses(&n);
    for (size_t k = 0; k < sums.size(); ++k) values[int64_t(k)] += sums[k];
  }
  if (parallel_.sizes.pp > 1) parallel_.pp->all_reduce(values);
  if (data_parallel_.sizes.dp > 1) data_parallel_.dp->all_reduce(values);
  return values / double(micro_batches * parallel_.sizes.dp);
}

void Trainer::update_batch_size(int64_t iteration) {
  // Megatron's order: the micro-batch count first (a change saves a checkpoint), then the
  // divisibility of the current batch (which only a step schedule can break at this point).
  const int64_t micro_dp = c_.training.micro_batch_size * parallel_.sizes.dp;
  const int64_t micro = batches_.micro_batches(consumed_train_samples_);
  if (micro_batches_ != 0 && micro != micro_batches_) {
    if (micro < micro_batches_)  // a step schedule whose batch falls; Megatron asserts the same
      throw UserError(strprintf("Number of microbatches should not decrease; going from %lld to %lld "
                                "(--step-batch-size-schedule: the batch sizes must not fall)",
                                (long long)micro_batches_, (long long)micro));
    log::info(strprintf("ramping up batch size from %lld to %lld", (long long)(micro_batches_ * micro_dp),
                        (long long)batches_.running_batch(consumed_train_samples_)));
    // Megatron saves a checkpoint whenever the micro-batch count changes.
    if (!c_.checkpoint.save.empty() && iteration > 1 && last_saved_iteration_ != iteration - 1) save(iteration - 1);
  } else if (micro_batches_ == 0 && batches_.ramps()) {
    log::info(strprintf("setting initial batch size to %lld", (long long)batches_.global_batch(consumed_train_samples_)));
  }
  if (batches_.running_batch(consumed_train_samples_) % micro_dp != 0)
    throw UserError(strprintf("current global batch size (%lld) is not divisible by micro_batch_size (%lld) * "
                              "data_parallel_size (%lld)",
                              (long long)batches_.running_batch(consumed_train_samples_),
                              (long long)c_.training.micro_batch_size, (long long)parallel_.sizes.dp));
  micro_batches_ = micro;
  current_global_batch_ = batches_.global_batch(consumed_train_samples_);
}

torch::Tensor Trainer::train_step(int64_t iteration) {
  iteration_ = iteration;
  if (fp8_) fp8_->collect_stats(fp8_stats_due(iteration));
  const rerun::PassPlan plan = rerun_->begin_iteration(iteration);
  std::optional<StepSnapshot> snapshot;
  if (plan.snapshot) snapshot.emplace(device_, fp8_.get(), model_buffers());
  Pass pass = forward_backward(iteration);
  torch::Tensor values = plan.judge ? numerics_->values(pass.loss, pass.prepared.grad_norm) : torch::Tensor();
  // The copy of the values is queued before the step, so that the wait below ends when they exist,
  // while the GPU still has the optimizer step to run.
  if (plan.judge) numerics_->start_read(values);
  bool stepped = plan.step_now;
  if (plan.step_now)
    last_step_ = apply_step(pass, plan.device_rejection ? numerics_->rejection(values, rerun_->calls(), plan) : torch::Tensor());
  while (plan.judge) {
    // The one wait for the device per iteration: the two values, after the step was queued.
    const auto [loss, grad_norm] = numerics_->finish_read();
    const rerun::PassOutcome outcome = rerun_->after_pass(loss, grad_norm);
    if (outcome.kind == rerun::PassOutcome::Kind::kStop)
      end_run(iteration, outcome, snapshot ? &*snapshot : nullptr, loss, grad_norm);
    if (outcome.kind == rerun::PassOutcome::Kind::kAccept) {
      if (outcome.step && !stepped) last_step_ = apply_step(pass, torch::Tensor());
      break;
    }
    // Again from the same state: the rejected pass's step was skipped on the device, so the
    // weights and the optimizer state are those before the iteration.
    FP8TRON_CHECK(snapshot.has_value(), "a re-run in place without a snapshot");
    snapshot->restore(moe_.get());
    if (fp8_param_gather_) optimizer_->publish_model_params();  // FP8 weights cast with the restored scales
    pass = forward_backward(iteration);
    values = numerics_->values(pass.loss, pass.prepared.grad_norm);
    numerics_->start_read(values);
    stepped = false;
  }
  account_step(pass);
  if (fp8_) fp8_->collect_stats(false);  // evaluation's casts are not the step's
  return pass.loss;
}

void Trainer::skip_zeroing_gemm_written_grads() {
  const auto& p = c_.precision;
  if (!p.grads_in_fp32 || !p.gradient_accumulation_fusion) return;
  std::vector<torch::Tensor> skipped;
  if (fp8_ && fp8_->overwrites_main_grads()) {
    // FP8 wgrad GEMMs write their fp32 main gradients (overwriting in a step's first backward).
    for (const auto& site : fp8_->sites()) skipped.push_back(site->parameter);
    fp8_->set_overwrite_main_grads(true);
  }
  if (device_.is_cuda() && param_dtype(c_) == torch::kBFloat16 && main_grad_first_write::enabled()) {
    // So do the bf16 linears' (models/linear/main_grad_first_write.h).
    std::vector<torch::Tensor> bf16;
    for (const auto& chunk : chunks_)
      for (auto& param : gemm_written_params(*chunk)) bf16.push_back(param);
    main_grad_first_write::own(bf16);
    skipped.insert(skipped.end(), bf16.begin(), bf16.end());
  }
  // Zeroing those 95% of the gradient buffer every step would be wasted bandwidth.
  if (!skipped.empty()) optimizer_->skip_zeroing(skipped);
}

Trainer::Pass Trainer::forward_backward(int64_t iteration) {
  const auto& t = c_.training;
  timers_.start("forward-backward", 1);
  const int64_t micro = micro_batches_;
  // --cuda-graph-impl full_iteration: after its warm-up steps the passes run as one CUDA graph
  // (trainer/step_graph.h). A replay repeats the first writes of the capture, whose record the
  // registry keeps.
  const bool graphed = step_graph_ && step_graph_->take_step(micro);
  optimizer_->zero_grad();
  if (!(graphed && step_graph_->replays(micro))) main_grad_first_write::new_step();
  // Each micro-batch's loss is scaled by 1 / (micro-batches x data-parallel ranks) in backward, and
  // the data-parallel reduction then sums: the same mean gradient as Megatron's local average
  // followed by a data-parallel average, but every micro-batch's gradients have the same magnitude
  // in every layout, so FP8 casts with scales from earlier steps (delayed scaling) round them alike
  // whatever the data-parallel size.
  // --calculate-per-token-loss: the summed token losses go backward unscaled and the gradients are
  // divided by the global loss-token count at the step. --ddp-average-in-collective: the
  // data-parallel sum is divided by the data-parallel size after the reduction instead.
  const bool per_token = t.calculate_per_token_loss, average_after = c_.distributed.average_in_collective;
  const double backward_scale =
      per_token ? scaler_.scale() : scaler_.scale() / double(micro * (average_after ? 1 : parallel_.sizes.dp));
  auto loss_tokens = torch::zeros({}, torch::TensorOptions().device(device_).dtype(torch::kFloat32));
  // The auxiliary losses' backward starts with the factors the lm loss gets (Megatron's
  // loss_scale x cp / micro-batches, or loss_scale with --calculate-per-token-loss; and the 1 / DP
  // its data-parallel average applies to them).
  if (moe_) moe_->set_aux_grad_scale(backward_scale);
  torch::Tensor loss_sum;
  if (graphed) {
    std::vector<Batch> batches;
    for (int64_t mb = 0; mb < micro; ++mb) batches.push_back(load_micro_batch(*train_loader_, mb, consumed_train_samples_));
    step_graph_->stage(batches);
    const auto outputs = step_graph_->run(micro, [&] {
      auto tokens = torch::zeros({}, loss_tokens.options());
      auto sum = run_micro_batches(micro, backward_scale, [&](int64_t mb) { return step_graph_->staged(mb); }, &tokens);
      return std::vector<torch::Tensor>{sum, tokens};
    });
    // The graph's outputs are overwritten by the next replay (a re-run of this iteration).
    loss_sum = outputs[0].clone();
    loss_tokens = outputs[1].clone();
  } else {
    loss_sum = run_micro_batches(
        micro, backward_scale,
        [&](int64_t mb) { return load_micro_batch(*train_loader_, mb, consumed_train_samples_); }, &loss_tokens);
  }
  timers_.stop("forward-backward", 1);
  if (t.numerics.test_nan_iteration == iteration && !t.numerics.test_nan_param.empty()) inject_nan_gradient();
  // After the timer's synchronization: the step's communication events are complete.
  if (tp_comm_timer_) timers_.add("tp-comm-exposed", 1, tp_comm_timer_->take_ms());
  if (pp_comm_timer_) timers_.add("pp-comm-exposed", 1, pp_comm_timer_->take_ms());

  timers_.start("optimizer", 1);
  main_grad_first_write::zero_unwritten();  // before the reductions read them
  optimizer_->finalize_grads();
  if (moe_) moe_->end_step();  // expert-bias update from the step's token counts (Megatron: finalize_model_grads)
  // Averaged before the step: with --overlap-param-gather the step leaves the weights' all-gathers
  // in flight on the data-parallel group, and a collective queued behind them would wait for all.
  if (per_token) loss_tokens = global_token_count(loss_tokens);
  Pass pass;
  pass.loss = average_loss(loss_sum, micro, loss_tokens);
  pass.mtp = mtp_losses(micro);
  // New scales (delayed scaling) and new weights to quantize before the step: --fp8-param-gather
  // casts the new weights with them in the step (as the next forward would), and the amax
  // reduction does not queue behind --overlap-param-gather's gathers.
  if (fp8_) end_fp8_step();
  // The optimizer divides the gradients by this before the norm and the update; none when it is 1
  // (bf16 without per-token loss on one data-parallel rank: a pass over every gradient saved).
  const double divisor = scaler_.scale() * (average_after ? double(parallel_.sizes.dp) : 1.0);
  torch::Tensor grad_divisor;
  if (per_token) grad_divisor = torch::full({}, divisor, loss_tokens.options()) * loss_tokens.clamp_min(1.0);
  else if (divisor != 1.0) grad_divisor = torch::full({}, divisor, loss_tokens.options());
  pass.prepared = optimizer_->prepare_step(grad_divisor);
  timers_.stop("optimizer", 1);
  return pass;
}

StepResult Trainer::apply_step(Pass& pass, const torch::Tensor& skip) {
  std::optional<double> decoupled_lr;
  if (c_.optimizer.decoupled_lr)
    decoupled_lr = schedule_.lr(*c_.optimizer.decoupled_lr, c_.optimizer.decoupled_min_lr.value_or(c_.optimizer.min_lr));
  timers_.start("optimizer", 1);
  StepResult result = optimizer_->apply_step(pass.prepared, schedule_.lr(), schedule_.weight_decay(), decoupled_lr, skip);
  timers_.stop("optimizer", 1);
  return result;
}

void Trainer::account_step(const Pass& pass) {
  const auto& t = c_.training;
  bool advance_schedule = true;
  if (scaler_.dynamic()) {
    // fp16: the scaler needs the overflow flag now (Megatron waits here too).
    const bool found_inf = last_step_.found_inf.item<float>() > 0;
    scaler_.update(found_inf);
    advance_schedule = !found_inf;
  }
  // Megatron advances the schedule and the consumed samples by the batch actually run.
  const int64_t batch = micro_batches_ * t.micro_batch_size * parallel_.sizes.dp;
  if (advance_schedule) schedule_.step(batch);
  consumed_train_samples_ += batch;

  // Megatron's counters: "skipped" = the update was not applied; "nan" = the loss was not finite.
  // Without a dynamic loss scale (bf16, fp32) a non-finite gradient is a nan iteration as well.
  const torch::Tensor& loss = pass.loss;
  auto loss_ok = loss.isfinite().to(torch::kFloat32);
  auto applied = 1.0 - last_step_.found_inf;
  interval_.loss_sum += torch::where(loss.isfinite(), loss, torch::zeros_like(loss)) * applied;
  interval_.loss_count += loss_ok * applied;
  interval_.skipped += last_step_.found_inf;
  interval_.nan += scaler_.dynamic() ? 1.0 - loss_ok : torch::maximum(1.0 - loss_ok, last_step_.found_inf);
  if (pass.mtp.defined()) {
    interval_.mtp_loss_sums += pass.mtp;
    mtp_history_.push_back(pass.mtp);
  }
}

void Trainer::skip_iteration(int64_t iteration) {
  const int64_t batch = micro_batches_ * c_.training.micro_batch_size * parallel_.sizes.dp;
  consumed_train_samples_ += batch;
  skipped_train_samples_ += batch;
  log::info(strprintf(" > skipping iteration %lld (--iterations-to-skip): its %lld samples are consumed without a "
                      "step",
                      (long long)iteration, (long long)batch));
}

// --log-fp8-stats-to-tensorboard: statistics are gathered in the steps TensorBoard logs.
bool Trainer::fp8_stats_due(int64_t iteration) const {
  const auto& g = c_.logging;
  return fp8_ && g.log_fp8_stats_to_tensorboard && !g.tensorboard_dir.empty() && iteration % g.tensorboard_log_interval == 0;
}

// Every rank's FP8 cast statistics of this step to rank 0's TensorBoard: a layer's tensor-parallel
// shards and data-parallel replicas add up (their amaxes: the maximum).
void Trainer::log_fp8_stats(int64_t iteration) {
  std::string mine;
  for (const auto& s : fp8_->take_stats())
    mine += strprintf("%s %s %.17g %.17g %.17g %.17g\n", s.site.c_str(), fp8::tensor_role_name(s.role), s.amax, s.underflows,
                      s.overflows, s.elements);
  const std::vector<std::string> all = all_gather_strings(parallel_, device_, mine);
  if (!tensorboard_) return;
  std::map<std::string, std::array<double, 4>> merged;  // "<site>/<role>" -> amax, underflows, overflows, elements
  for (const std::string& text : all) {
    std::istringstream in(text);
    std::string site, role;
    std::array<double, 4> v{};
    while (in >> site >> role >> v[0] >> v[1] >> v[2] >> v[3]) {
      auto [it, fresh] = merged.try_emplace(site + "/" + role, v);
      if (fresh) continue;
      it->second[0] = std::max(it->second[0], v[0]);
      for (int i = 1; i < 4; ++i) it->second[size_t(i)] += v[size_t(i)];
    }
  }
  for (const auto& [key, v] : merged) {
    tensorboard_->add_scalar("fp8/" + key + "/amax", v[0], iteration);
    tensorboard_->add_scalar("fp8/" + key + "/underflows", v[1], iteration);
    tensorboard_->add_scalar("fp8/" + key + "/overflows", v[2], iteration);
    tensorboard_->add_scalar("fp8/" + key + "/elements", v[3], iteration);
  }
}

// --fp8tron-test-inject-nan ITER:PARAM: NaN in the first element of PARAM's gradient, on the
// ranks holding it.
void Trainer::inject_nan_gradient() {
  torch::NoGradGuard no_grad;
  for (auto& chunk : chunks_)
    for (const auto& item : chunk->named_parameters())
      if (item.key() == c_.training.numerics.test_nan_param && item.value().grad().defined() && item.value().numel() > 0)
        item.value().grad().view({-1})[0].fill_(std::nan(""));
}

std::string Trainer::first_nonfinite_grad_everywhere() {
  // Each rank's first, then the first of all in pipeline order: (pipeline rank, position, name).
  std::string mine;
  if (const auto first = optimizer_->first_nonfinite_grad())
    mine = strprintf("%06d %012lld %s", parallel_.pp_rank, (long long)first->first, first->second.c_str());
  std::string best;
  for (const std::string& other : all_gather_strings(parallel_, device_, mine))
    if (!other.empty() && (best.empty() || other < best)) best = other;
  return best.empty() ? "" : best.substr(20);
}

void Trainer::end_run(int64_t iteration, const rerun::PassOutcome& outcome, const StepSnapshot* snapshot, double loss,
                      double grad_norm) {
  const bool gradient = !std::isfinite(grad_norm);
  const std::string param = gradient ? first_nonfinite_grad_everywhere() : "";
  std::string where;
  if (!param.empty()) where = " (the first parameter whose gradient is not finite: " + param + ")";
  else if (gradient) where = " (every gradient element is finite: their squares overflow the norm)";
  if (outcome.save_checkpoint) {
    // The state before the iteration (its step was skipped), with the record a restarted job reads.
    FP8TRON_CHECK(snapshot != nullptr, "a checkpoint for a re-run without a snapshot");
    snapshot->restore(moe_.get());
    if (fp8_param_gather_) optimizer_->publish_model_params();
    std::string mine;
    for (const auto& [rank, hw] : rerun_->own_suspect_entry())
      mine = strprintf("%d %d %s", rank, hw.device, hw.node.c_str());
    std::vector<std::pair<int, rerun::Hardware>> suspects;
    for (const std::string& entry : all_gather_strings(parallel_, device_, mine)) {
      if (entry.empty()) continue;
      std::istringstream in(entry);
      int rank = 0;
      rerun::Hardware hw;
      in >> rank >> hw.device;
      std::getline(in >> std::ws, hw.node);
      suspects.emplace_back(rank, hw);
    }
    rerun_->set_suspects(suspects);
    rerun_io_.to_save = rerun_->record();
    save(iteration - 1);
    rerun_io_.to_save.reset();
  }
  // A save prepared before this step holds a good state: it is committed before stopping.
  if (async_saver_) async_saver_->finalize(checkpoint_state(), /*blocking=*/true);
  if (outcome.exit_status != 1) {
    const bool fatal_gradient = outcome.failed_call && rerun_->calls()[*outcome.failed_call].subject ==
                                                           rerun::Subject::kGradNorm && gradient;
    throw RunEnd(outcome.exit_status, outcome.conclusion + (fatal_gradient ? where : ""));
  }
  // --rerun-mode disabled (or a job's first iteration): today's one line.
  const std::string what = !std::isfinite(loss)
                               ? "the loss is " + value_text(loss) + (gradient ? " and the gradient norm " + value_text(grad_norm) : "")
                               : "the gradient norm is " + value_text(grad_norm);
  throw UserError(strprintf("iteration %lld: %s%s; stopping, as --check-for-nan-in-loss-and-grad asks%s. Resume from "
                            "the last checkpoint with a lower --lr or other data, or pass "
                            "--no-check-for-nan-in-loss-and-grad to skip such iterations instead",
                            (long long)iteration, what.c_str(), where.c_str(),
                            gradient ? " (this iteration's update was not applied)" : ""));
}

double Trainer::evaluate() {
  optimizer_->finish_param_gather();  // as Megatron: evaluation does not overlap the gather
  for (auto& m : chunks_) m->eval();
  const auto& t = c_.training;
  auto total = torch::zeros({}, torch::TensorOptions().device(device_).dtype(torch::kFloat32));
  auto tokens = torch::zeros_like(total);
  for (int64_t i = 0; i < t.eval_iters; ++i) {
    total += pipeline_->run_forward_only(t.num_micro_batches, [&](int chunk, int64_t mb, const torch::Tensor& input) {
      return forward_chunk(
          chunk, input, [&] { return load_micro_batch(*valid_loader_, mb, consumed_valid_samples_); }, &tokens);
    });
    consumed_valid_samples_ += t.global_batch_size;
  }
  for (auto& m : chunks_) m->train();
  const double loss = t.calculate_per_token_loss
                         ? average_loss(total, 0, global_token_count(tokens)).item<double>()
                         : average_loss(total, t.num_micro_batches, tokens).item<double>() /
                               double(std::max<int64_t>(1, t.eval_iters));
  for (auto* timer : {tp_comm_timer_.get(), pp_comm_timer_.get()})
    if (timer) timer->take_ms();  // evaluation's waits are not a training step's
  return loss;
}

void Trainer::report_moe(int64_t iteration) {
  // This step's micro-batch count (a batch-size ramp-up changes it), as Megatron's get_num_microbatches().
  const MoeMetricsReport r = report_moe_metrics(*moe_, parallel_, micro_batches_, device_, logged_moe_layers(c_.model));
  for (const auto& [name, value] : r.scalars) {
    interval_.add_moe(name, value);
    moe_history_[name].push_back(value);
  }
  if (!tensorboard_) return;
  // Every iteration, as Megatron's training_log (not gated by --tensorboard-log-interval).
  for (const auto& [name, value] : r.scalars) tensorboard_->add_scalar(name, value.item<double>(), iteration);
  if (!c_.model.moe.per_layer_logging) return;
  for (const auto& [name, values] : r.per_layer) {
    auto host = values.cpu();
    for (int64_t i = 0; i < host.numel(); ++i)
      tensorboard_->add_scalar("moe/" + name + "_layer_" + std::to_string(i), host[i].item<double>(), iteration);
  }
}

void Trainer::log_interval(int64_t iteration, double seconds, int64_t iterations_in_interval) {
  const auto& t = c_.training;
  IterationStats s;
  s.iteration = iteration;
  s.train_iters = t.train_iters;
  s.consumed_samples = consumed_train_samples_;
  s.skipped_samples = skipped_train_samples_;
  s.elapsed_ms_per_iteration = seconds * 1000.0 / double(iterations_in_interval);
  const double tokens_per_iteration = double(micro_batches_ * t.micro_batch_size * parallel_.sizes.dp * c_.model.seq_length);
  const double per_iteration_s = seconds / double(iterations_in_interval);
  if (c_.logging.log_throughput)
    s.tflops_per_gpu = training_flops_per_token(c_.model) * tokens_per_iteration / per_iteration_s /
                       double(c_.parallel.world_size) / 1e12;
  s.tokens_per_second = tokens_per_iteration / per_iteration_s;
  s.learning_rate = schedule_.lr();
  s.global_batch_size = current_global_batch_;
  const double count = interval_.loss_count.item<double>();
  s.lm_loss = count > 0 ? interval_.loss_sum.item<double>() / count : std::nan("");
  for (int64_t k = 0; k < c_.model.mtp.num_layers; ++k)
    s.mtp_losses.push_back(interval_.mtp_loss_sums[k].item<double>() / double(iterations_in_interval));
  // Megatron divides the MoE losses by the advanced (not skipped) iterations of the interval.
  const double advanced = std::max(1.0, double(iterations_in_interval) - interval_.skipped.item<double>());
  for (const auto& [name, sum] : interval_.moe_sums) s.moe_losses.emplace_back(name, sum.item<double>() / advanced);
  s.loss_scale = scaler_.scale();
  s.grad_norm = last_step_.grad_norm.item<double>();
  if (last_step_.num_zeros.defined()) s.num_zeros = last_step_.num_zeros.item<int64_t>();
  if (c_.logging.log_params_norm) s.params_norm = optimizer_->params_norm().item<double>();
  s.skipped_iterations = int64_t(interval_.skipped.item<double>());
  s.nan_iterations = int64_t(interval_.nan.item<double>());
  // Megatron prints this line with print_rank_last, not through logging: --logging-level never hides it.
  log::print(format_iteration_line(s));
  if (tensorboard_ && s.tflops_per_gpu) tensorboard_->add_scalar("throughput", *s.tflops_per_gpu, iteration);
  interval_.reset(device_, c_.model.mtp.num_layers);
}

void Trainer::write_tensorboard(int64_t iteration, const torch::Tensor& loss) {
  const double l = loss.item<double>();
  const double params_norm = c_.logging.log_params_norm ? optimizer_->params_norm().item<double>() : 0.0;
  if (!tensorboard_) return;  // every rank joins the norm's collectives; rank 0 writes
  // Megatron's training_log scalars, each also against the consumed samples.
  const auto& g = c_.logging;
  auto both = [&](const std::string& tag, double value) {
    tensorboard_->add_scalar(tag, value, iteration);
    tensorboard_->add_scalar(tag + " vs samples", value, consumed_train_samples_);
  };
  both("learning-rate", schedule_.lr());
  if (skipped_train_samples_ > 0) tensorboard_->add_scalar("skipped-train-samples", double(skipped_train_samples_), iteration);
  both("batch-size", double(current_global_batch_));
  both("lm loss", l);
  if (g.log_loss_scale_to_tensorboard) both("loss-scale", scaler_.scale());
  if (g.log_world_size_to_tensorboard) both("world-size", double(c_.parallel.world_size));
  both("grad-norm", last_step_.grad_norm.item<double>());
  if (last_step_.num_zeros.defined()) both("num-zeros", double(last_step_.num_zeros.item<int64_t>()));
  if (g.log_params_norm) both("params-norm", params_norm);
  if (g.log_memory_to_tensorboard && device_.is_cuda()) {
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device_.index());
    const auto all = size_t(c10::CachingAllocator::StatType::AGGREGATE);
    tensorboard_->add_scalar("mem-reserved-bytes", double(stats.reserved_bytes[all].current), iteration);
    tensorboard_->add_scalar("mem-allocated-bytes", double(stats.allocated_bytes[all].current), iteration);
    tensorboard_->add_scalar("mem-max-allocated-bytes", double(stats.allocated_bytes[all].peak), iteration);
    tensorboard_->add_scalar("mem-allocated-count", double(stats.allocation[all].current), iteration);
  }
}

// The timers' report, in Megatron's log order, with every rank's times gathered over the world.
Timers::Report Trainer::timer_report(double iterations) {
  // tp-comm-exposed / pp-comm-exposed: the waits for tensor-parallel collectives and pipeline
  // receives that no computation hid (parallel/overlap/comm_timer.h).
  static const std::vector<std::string> kLogOrder = {"forward-backward", "batch-generator", "moe-token-dispatch",
                                                     "moe-token-combine", "optimizer", "tp-comm-exposed",
                                                     "pp-comm-exposed"};
  auto gather = [this](const std::vector<double>& mine) {
    const int n = parallel_.sizes.world_size;
    auto local = torch::tensor(mine, torch::TensorOptions().dtype(torch::kFloat64)).to(device_);
    auto all = torch::empty({n * int64_t(mine.size())}, local.options());
    parallel_.world->all_gather(all, local);
    all = all.cpu();
    return std::vector<double>(all.data_ptr<double>(), all.data_ptr<double>() + all.numel());
  };
  return timers_.report(kLogOrder, iterations, c_.logging.timing_log_option, gather, parallel_.sizes.world_size);
}

// The global (tensor-parallel-gathered) fp32 value of each of this rank's parameters, and a few
// values of each in `sample` (determinism tests compare those).
std::map<std::string, torch::Tensor> Trainer::global_weights(std::vector<double>* sample) {
  torch::NoGradGuard no_grad;
  optimizer_->finish_param_gather();
  std::map<std::string, torch::Tensor> out;
  for (auto& chunk : chunks_) {
    const auto infos = chunk->param_infos();
    for (const auto& item : chunk->named_parameters()) {
      const ParamInfo& info = infos.at(item.key());
      Communicator& group = info.expert ? *parallel_.expert_tp : *parallel_.tp;  // experts: sharded over expert TP
      auto global = gather_global_param(item.value().detach().to(torch::kFloat32), info, group).cpu();
      if (!info.shared_embedding_copy) out[item.key()] = global;
      if (!sample) continue;
      auto flat = global.reshape({-1}).to(torch::kFloat64);
      sample->push_back(flat[0].item<double>());
      sample->push_back(flat.sum().item<double>());
    }
  }
  return out;
}

TrainingState Trainer::checkpoint_state() {
  TrainingState state{c_, data_parallel_, device_, *optimizer_, schedule_, scaler_, consumed_train_samples_, consumed_valid_samples_,
                      fp8_.get()};
  for (auto& chunk : chunks_)
    for (const auto& item : chunk->named_buffers()) state.buffers.emplace_back(item.key(), item.value());
  state.skipped_train_samples = &skipped_train_samples_;
  state.rerun = &rerun_io_;
  return state;
}

void Trainer::save(int64_t iteration, bool non_persistent) {
  if (c_.checkpoint.async_save) {
    if (!async_saver_) async_saver_ = std::make_unique<AsyncCheckpointSaver>();
    async_saver_->save(checkpoint_state(), iteration, non_persistent);
  } else {
    save_checkpoint(checkpoint_state(), iteration, non_persistent);
  }
  // A non-persistent checkpoint does not stand in for the persistent one at the end or on exit.
  if (!non_persistent) last_saved_iteration_ = iteration;
}

void Trainer::check_weight_hashes_across_replicas(int64_t iteration) {
  optimizer_->finish_param_gather();
  std::vector<std::pair<std::string, torch::Tensor>> params, experts;
  for (auto& chunk : chunks_) {
    const auto infos = chunk->param_infos();
    for (const auto& item : chunk->named_parameters())
      (infos.at(item.key()).expert ? experts : params).emplace_back(item.key(), item.value());
  }
  log::print(check_weight_hashes(params, experts, parallel_, iteration));
}

// Megatron's rule: every --eval-interval iterations, from --start-eval-at-iter on.
bool Trainer::evaluation_due(int64_t iteration) const {
  const auto& t = c_.training;
  return t.eval_iters > 0 && valid_loader_->has_data() && iteration % t.eval_interval == 0 &&
         (!t.start_eval_at_iter || iteration >= *t.start_eval_at_iter);
}

void Trainer::write_validation_tensorboard(int64_t iteration, double loss) {
  if (!tensorboard_) return;
  tensorboard_->add_scalar("lm loss validation", loss, iteration);
  tensorboard_->add_scalar("lm loss validation vs samples", loss, consumed_train_samples_);
  if (c_.logging.log_validation_ppl_to_tensorboard) {
    const double ppl = std::exp(std::min(20.0, loss));
    tensorboard_->add_scalar("lm loss validation ppl", ppl, iteration);
    tensorboard_->add_scalar("lm loss validation ppl vs samples", ppl, consumed_train_samples_);
  }
}

// Megatron's checkpoint_and_decide_exit, after every iteration: an exit signal, the save interval,
// the time limit and the exit interval, in that order. Exits save first when --save is given.
bool Trainer::checkpoint_and_decide_exit(int64_t iteration, Clock::time_point start, const ExitSignalHandler* signal) {
  const auto& t = c_.training;
  const auto& k = c_.checkpoint;
  const bool saving = !k.save.empty();
  if (async_saver_) async_saver_->finalize(checkpoint_state(), /*blocking=*/false);  // commits a finished one
  if (signal) {
    // Every rank stops at the same iteration: a signal on any rank counts.
    auto got = torch::full({1}, signal->received() ? 1.0f : 0.0f, torch::TensorOptions().device(device_));
    if (parallel_.sizes.world_size > 1) parallel_.world->all_reduce(got, ReduceOp::Max);
    if (got.item<float>() > 0) {
      if (saving) save(iteration);
      log::print("exiting program after receiving " + k.exit_signal_name + ".");
      return true;
    }
  }
  if (saving && k.save_interval && iteration % *k.save_interval == 0)
    save(iteration);
  else if (saving && k.non_persistent_save_interval && iteration % *k.non_persistent_save_interval == 0)
    save(iteration, /*non_persistent=*/true);
  if (t.exit_duration_in_mins) {
    // Every rank must stop at the same iteration: rank 0's clock decides.
    auto over = torch::tensor({std::chrono::duration<double>(Clock::now() - start).count() / 60.0 >
                                       double(*t.exit_duration_in_mins) ? 1.0f : 0.0f});
    if (parallel_.sizes.world_size > 1) { over = over.to(device_); parallel_.world->broadcast(over, 0); }
    if (over.item<float>() > 0) {
      if (saving && last_saved_iteration_ != iteration) save(iteration);
      log::print(strprintf("exiting program after %lld minutes", (long long)*t.exit_duration_in_mins));
      return true;
    }
  }
  if (t.exit_interval && iteration % *t.exit_interval == 0) {
    if (saving && last_saved_iteration_ != iteration) save(iteration);
    log::print(strprintf("exiting program at iteration %lld", (long long)iteration));
    return true;
  }
  return false;
}

TrainResult Trainer::run() {
  build();
  if (c_.checkpoint.async_save && !c_.checkpoint.save.empty()) {
    // The host memory of the snapshots is allocated in the background from now on.
    async_saver_ = std::make_unique<AsyncCheckpointSaver>();
    async_saver_->reserve(checkpoint_state());
  }
  const int64_t first_iteration = load_checkpoint(checkpoint_state()) + 1;
  if (rerun_io_.loaded) {
    rerun_->resume_from(*rerun_io_.loaded, rerun_io_.loaded_same_layout);
    rerun_io_.loaded.reset();
  }
  // --fp8-param-gather: the loaded weights cast with the loaded FP8 scales, as the step that
  // saved them published them.
  if (fp8_param_gather_ && first_iteration > 1) optimizer_->publish_model_params();
  TrainResult result;
  if (options_.collect_initial_weights) result.initial_weights = global_weights();
  std::optional<ExitSignalHandler> exit_signal;
  if (c_.checkpoint.exit_signal_handler) exit_signal.emplace(c_.checkpoint.exit_signal);
  StepProfiler profiler(c_.profiling, parallel_.world_rank, c_.logging.tensorboard_dir, device_.is_cuda());
  const auto& t = c_.training;
  result.iterations = first_iteration - 1;
  if (c_.training.weight_hash_interval) check_weight_hashes_across_replicas(result.iterations);
  std::vector<torch::Tensor> losses, grad_norms;
  losses.reserve(size_t(t.train_iters));
  log::print("training ...");
  const auto start = Clock::now();
  auto interval_start = start;
  int64_t interval_iterations = 0;
  bool memory_reported = false;
  for (int64_t iteration = first_iteration; iteration <= t.train_iters; ++iteration) {
    profiler.before_iteration(iteration, [this] { synchronize(); });
    update_batch_size(iteration);
    if (iterations_to_skip_.count(iteration)) {
      // Megatron's skip: nothing else of the loop runs (no log line, save or exit check).
      skip_iteration(iteration);
      result.iterations = iteration;
      if (parallel_.progress) parallel_.progress->iteration_finished(iteration);
      continue;
    }
    losses.push_back(train_step(iteration));
    if (options_.collect_grad_norms)
      grad_norms.push_back(last_step_.grad_norm.defined() ? last_step_.grad_norm.detach().clone()
                                                          : torch::full({}, std::nan(""), torch::kFloat64));
    if (moe_) report_moe(iteration);
    ++interval_iterations;
    result.iterations = iteration;
    if (parallel_.progress) parallel_.progress->iteration_finished(iteration);
    if ((tensorboard_ || c_.logging.log_params_norm) && !c_.logging.tensorboard_dir.empty() &&
        iteration % c_.logging.tensorboard_log_interval == 0)
      write_tensorboard(iteration, losses.back());
    if (fp8_stats_due(iteration)) log_fp8_stats(iteration);
    if (iteration % c_.logging.log_interval == 0) {
      synchronize();
      const auto now = Clock::now();
      log_interval(iteration, std::chrono::duration<double>(now - interval_start).count(), interval_iterations);
      const Timers::Report timing = timer_report(double(interval_iterations));
      if (!timing.text.empty()) log::print(timing.text);
      if (tensorboard_ && c_.logging.log_timers_to_tensorboard)
        for (const auto& [name, ms] : timing.max_ms) tensorboard_->add_scalar(name + "-time", ms, iteration);
      if (!memory_reported) { log::print(memory_report(device_, iteration)); memory_reported = true; }
      interval_start = Clock::now();
      interval_iterations = 0;
    }
    if (evaluation_due(iteration)) {
      const auto eval_start = Clock::now();
      result.last_validation_loss = evaluate();
      log::print(format_validation_block(strprintf("validation loss at iteration %lld", (long long)iteration),
                                        result.last_validation_loss));
      if (tensorboard_) {
        write_validation_tensorboard(iteration, result.last_validation_loss);
      }
      interval_start += Clock::now() - eval_start;  // evaluation time is not training time
    }
    if (t.weight_hash_interval && iteration % *t.weight_hash_interval == 0) check_weight_hashes_across_replicas(iteration);
    const auto decide_start = Clock::now();
    const bool exit = checkpoint_and_decide_exit(iteration, start, exit_signal ? &*exit_signal : nullptr);
    interval_start += Clock::now() - decide_start;  // neither is saving
    if (exit) break;
  }
  profiler.finish();  // a window that reaches past the last iteration ends here
  // As Megatron: a checkpoint at the end of training unless the last iteration was just saved.
  if (!c_.checkpoint.save.empty() && result.iterations >= first_iteration && last_saved_iteration_ != result.iterations)
    save(result.iterations);
  if (async_saver_) async_saver_->finalize(checkpoint_state(), /*blocking=*/true);
  if (t.eval_iters > 0 && valid_loader_->has_data() && result.iterations % t.eval_interval != 0) {
    result.last_validation_loss = evaluate();
    log::print(format_validation_block("validation loss at the end of training for val data", result.last_validation_loss));
  }
  optimizer_->finish_param_gather();  // the weights are complete when training returns
  synchronize();
  for (const auto& l : losses) result.losses.push_back(l.item<double>());
  for (const auto& g : grad_norms) result.grad_norms.push_back(g.item<double>());
  for (const auto& [name, values] : moe_history_)
    for (const auto& v : values) result.moe_losses[name].push_back(v.item<double>());
  for (const auto& values : mtp_history_) {
    const auto host = values.cpu();
    for (int64_t k = 0; k < host.numel(); ++k) result.mtp_losses["mtp_" + std::to_string(k + 1)].push_back(host[k].item<double>());
  }
  result.consumed_samples = consumed_train_samples_;
  if (step_graph_) result.cuda_graph_replays = step_graph_->replayed();
  // Gathering every global weight to the host is for tests; a real run skips it.
  if (options_.collect_final_weights) result.final_weights = global_weights(&result.final_weights_sample);
  if (tensorboard_) tensorboard_->flush();
  return result;
}

}  // namespace

TrainResult train(const Config& config, const TrainOptions& options) {
  require_supported(config);
  if (!config.checkpoint.test_kill_at.empty()) checkpoint::arm_fault_point(config.checkpoint.test_kill_at);
  Trainer trainer(config, options);
  return trainer.run();
}

}  // namespace fp8tron
