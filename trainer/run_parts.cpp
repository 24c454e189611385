#include "trainer/run_parts.h"

#include <c10/cuda/CUDAFunctions.h>
#include <unistd.h>

#include <filesystem>
#include <map>
#include <regex>

#include "core/config/batch_schedule.h"
#include "checkpoint/rank_agreement.h"
#include "trainer/cli/config_builder.h"
#include "core/error.h"
#include "core/log.h"
#include "core/text.h"
#include "data/loader/builtin_datasets.h"
#include "data/loader/cyclic_source.h"
#include "data/loader/file_source.h"
#include "fp8/forward_replay.h"
#include "models/linear/modules.h"
#include "parallel/layer_split.h"
#include "parallel/optimizer_instances.h"
#include "rerun/validation_calls.h"
#include "trainer/cli/model_math.h"
#include "trainer/moe_metrics.h"

namespace fp8tron {

torch::Dtype param_dtype(const Config& c) {
  return c.precision.params_dtype == ParamDtype::Bf16 ? torch::kBFloat16
         : c.precision.params_dtype == ParamDtype::Fp16 ? torch::kFloat16 : torch::kFloat32;
}

RunParts::RunParts(const Config& c)
    : config(c),
      device(c.device == "cuda" ? torch::Device(torch::kCUDA, c.launch.local_rank % std::max(1, int(torch::cuda::device_count())))
                                : torch::Device(torch::kCPU)) {}

void RunParts::synchronize() const {
  if (device.is_cuda()) torch::cuda::synchronize(device.index());
}

std::vector<torch::Tensor> RunParts::model_buffers() const {
  std::vector<torch::Tensor> out;
  for (const auto& chunk : chunks)
    for (const auto& item : chunk->named_buffers()) out.push_back(item.value());
  return out;
}

std::vector<bool> RunParts::any_rank(const std::vector<bool>& flags) const {
  if (parallel.sizes.world_size == 1) return flags;
  std::vector<float> values(flags.begin(), flags.end());
  auto t = torch::tensor(values, torch::kFloat32).to(device);
  parallel.world->all_reduce(t, ReduceOp::Max);
  t = t.cpu();
  std::vector<bool> out;
  for (int64_t i = 0; i < t.numel(); ++i) out.push_back(t[i].item<float>() > 0);
  return out;
}

namespace {

std::array<int64_t, 3> split_samples(const TrainingConfig& t) {
  return megatron_split_samples(t.train_iters, t.train_samples, t.global_batch_size, t.eval_global_batch_size,
                                t.eval_interval, t.eval_iters, t.start_eval_at_iter);
}

std::shared_ptr<SampleSource> make_source(const Config& c) {
  switch (c.data.source) {
    case DataSource::Mock: {
      // Megatron's mock dataset is sized as its train/valid/test splits are.
      const auto& t = c.training;
      const auto n = split_samples(t);
      return make_mock_source(c.model.seq_length, c.model.vocab_size, c.data.eod, t.seed, {n[0], n[1], n[2]});
    }
    case DataSource::Builtin: return make_builtin_source(c.model.seq_length, c.model.vocab_size, c.training.seed);
    case DataSource::Files: {
      const auto& t = c.training;
      FileSourceSizes sizes{split_samples(t), c.model.seq_length, t.seed};
      return make_file_source(c.data, sizes);
    }
  }
  FP8TRON_CHECK(false, "unknown data source");
}

// Creates a directory checkpoints will be saved in, or says, naming its flag, why it cannot be:
// found now, not at the first save after hours of training.
void create_save_dir(const std::string& flag, const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (std::filesystem::is_directory(dir)) return;
  std::string why;
  if (std::filesystem::exists(dir)) why = "it is a file, not a directory";
  else if (ec == std::errc::not_a_directory) why = "a part of that path is a file, not a directory";
  else if (ec == std::errc::permission_denied) why = "permission denied (this user cannot create directories there)";
  else if (ec == std::errc::read_only_file_system) why = "the file system is read-only";
  else why = ec ? ec.message() : "unknown reason";
  throw UserError(flag + " " + dir + " cannot be created: " + why + "; give " + flag +
                  " a directory this user can create and write");
}

// One job per save directory (checkpoint/save_dir_lock.h): rank 0 holds the locks of --save (and
// of a separate --non-persistent-global-ckpt-dir); every rank stops with rank 0's refusal.
void lock_save_dirs(RunParts& r) {
  const auto& k = r.config.checkpoint;
  if (k.save.empty()) return;
  std::vector<std::pair<std::string, std::string>> dirs = {{"--save", k.save}};
  if (k.non_persistent_save_interval && !k.non_persistent_dir.empty())
    dirs.emplace_back("--non-persistent-global-ckpt-dir", k.non_persistent_dir);
  std::string error;
  if (r.parallel.world_rank == 0) {
    try {
      for (const auto& [flag, dir] : dirs) {
        create_save_dir(flag, dir);
        auto lock = checkpoint::SaveDirLock::acquire(dir);
        if (!lock->taken_over().empty())
          log::info(" > " + lock->path() + ": taking over the lock of a job that is gone (" + lock->taken_over() + ")");
        r.save_locks.push_back(std::move(lock));
      }
    } catch (const UserError& e) {
      error = e.what();
      r.save_locks.clear();
    }
  }
  const std::string refusal = all_gather_strings(r.parallel, r.device, error).front();
  if (!refusal.empty()) throw UserError(refusal);
}

// The context-parallel groups and the data-parallel view (collective).
void build_context_parallel(RunParts& r) {
  r.data_parallel = r.parallel;
  if (r.parallel.sizes.cp == 1) return;
  // The hierarchical levels exist for a2a+p2p layers only (Megatron creates them regardless).
  bool hierarchical = false;
  for (CpCommType t : r.config.context_parallel.comm_types) hierarchical = hierarchical || t == CpCommType::A2AP2P;
  const auto groups = build_context_parallel_groups(
      r.parallel, hierarchical ? r.config.context_parallel.hierarchical_sizes : std::vector<int>{});
  r.cp = ContextParallelContext{r.config.context_parallel, r.parallel.cp, groups.a2a_level, groups.p2p_level};
  r.data_parallel = with_context_parallel_in_data_parallel(r.parallel, groups.dp_cp);
}

void build_fp8_and_moe(RunParts& r, Timers& timers) {
  const Config& c = r.config;
  if (c.precision.fp8.enabled()) {
    const Fp8Config& f = c.precision.fp8;
    fp8::Fp8EngineOptions o{*f.recipe, f.min_features, f.bf16_first_layers, f.bf16_last_layers, c.model.num_layers,
                            c.training.deterministic};
    o.gradient_accumulation_fusion = c.precision.gradient_accumulation_fusion;
    o.autotune_gemms = f.gemm_autotune;
    o.keep_transposes = f.keep_transposes;
    o.fp8_wgrad = f.wgrad;
    o.dot_product_attention = f.dot_product_attention;
    o.attention_emulated = f.attention_emulated;
    r.fp8 = std::make_shared<fp8::Fp8Engine>(o, r.device);
  }
  if (c.model.moe.enabled()) {
    const ParallelState& p = r.parallel;
    ExpertParallelGroups g{p.ep, p.expert_tp, p.expert_tp_ep, p.tp_cp, p.tp_dp_cp, p.ep_rank, p.expert_tp_rank};
    r.moe = std::make_shared<MoeContext>(c.model.moe, moe_metric_layers(c.model), std::move(g));
    r.moe->set_timer([&timers](const char* name, bool start) {
      if (start) timers.start(name, 2);
      else timers.stop(name, 2);
    });
  }
}

// This pipeline rank's model chunks, and their parameters for the optimizer.
std::vector<NamedParam> build_chunks(RunParts& r) {
  const Config& c = r.config;
  TensorParallelContext tp{r.parallel.tp, r.parallel.tp_rank, r.parallel.sizes.tp, r.parallel.sequence_parallel};
  if (c.distributed.tp_overlap.enabled()) tp.overlap = std::make_shared<TpOverlapConfig>(c.distributed.tp_overlap);
  std::vector<NamedParam> params;
  for (const ChunkPlan& plan : plan_pipeline_chunks(pipeline_split(c), r.parallel.pp_rank)) {
    StageSpec spec{plan.first_layer, plan.num_layers, plan.embedding, plan.loss};
    // Weights are drawn on the CPU in fp32 from (seed, name): every layout and device starts from
    // the same global weights; then they move to the device and the optimizer casts them.
    GptModel chunk(c.model, tp, spec, r.fp8, r.moe, r.cp, r.main_grads);
    chunk->to(r.device);
    chunk->train();
    chunk->set_per_token_loss(c.training.calculate_per_token_loss);
    if (c.distributed.defer_embedding_wgrad && spec.has_head) chunk->defer_output_wgrad(c.distributed.wgrad_deferral_limit);
    const auto infos = chunk->param_infos();
    const int index = int(r.chunks.size());
    for (const auto& item : chunk->named_parameters())
      params.push_back({item.key(), item.value(), infos.at(item.key()), index});
    r.chunks.push_back(chunk);
  }
  return params;
}

// The gradients the wgrad GEMMs write in a step's first backward leave the optimizer's zeroing.
void skip_zeroing_gemm_written_grads(RunParts& r, bool first_writes) {
  const auto& p = r.config.precision;
  if (!p.grads_in_fp32 || !p.gradient_accumulation_fusion) return;
  std::vector<torch::Tensor> skipped;
  if (r.fp8 && r.fp8->overwrites_main_grads()) {
    // FP8 wgrad GEMMs write their fp32 main gradients (overwriting in a step's first backward).
    for (const auto& site : r.fp8->sites()) skipped.push_back(site->parameter);
    r.fp8->set_overwrite_main_grads(true);
  }
  // Not with sharded gradients: each unit's buffer is zeroed afresh as its backward pass starts.
  if (r.device.is_cuda() && param_dtype(r.config) == torch::kBFloat16 && first_writes && !r.config.distributed.shard_grads()) {
    // So do the bf16 linears' (models/linear/main_grads.h).
    std::vector<torch::Tensor> bf16;
    for (const auto& chunk : r.chunks)
      for (auto& param : gemm_written_params(*chunk)) bf16.push_back(param);
    r.main_grads->own(bf16);
    skipped.insert(skipped.end(), bf16.begin(), bf16.end());
  }
  // Zeroing those 95% of the gradient buffer every step would be wasted bandwidth.
  if (!skipped.empty()) r.optimizer->skip_zeroing(skipped);
}

// A parameter's sharded-weight unit (--data-parallel-sharding-strategy optim_grads_params): its
// transformer layer, else the module holding it (an embedding table, the final norm, the output layer).
std::string sharded_weight_unit(const std::string& name) {
  static const std::regex layer(R"(^(.*\blayers\.[0-9]+)\.)");
  std::smatch m;
  if (std::regex_search(name, m, layer)) return m[1].str();
  return name.substr(0, name.rfind('.'));
}

// Megatron-FSDP's optim_grads_params: each rank keeps only its shard of the weights; the model's
// hooks gather a unit's weights before a part runs forward and release them after (and again
// around its backward pass, see parallel/sharded_weights.h). optim_grads: the same units, gathered
// at their first use after each step and kept, so that each unit's gradients are reduce-scattered
// after its backward pass (parallel/sharded_grads.h).
void shard_weights(RunParts& r) {
  std::vector<std::vector<torch::Tensor>> units;
  std::map<std::string, size_t> unit_of;
  for (const auto& chunk : r.chunks)
    for (const auto& item : chunk->named_parameters()) {
      auto [it, added] = unit_of.emplace(sharded_weight_unit(item.key()), units.size());
      if (added) units.emplace_back();
      units[it->second].push_back(item.value());
    }
  const auto& d = r.config.distributed;
  GatherPolicy policy{d.overlap_param_gather, d.keep_params_after_forward};
  policy.keep_gathered = !d.shard_params();
  policy.replaying = fp8::forward_replay_active;  // set by every recomputation's replay, FP8 or not
  r.optimizer->shard_model_params(units, std::move(policy));
  MixedPrecisionOptimizer* optimizer = r.optimizer.get();
  // A deferred bias's gradient, written by the next part's kernels before its own unit's pass.
  r.main_grads->set_allocate_on_write([optimizer](const torch::Tensor& param) { optimizer->allocate_grad_of(param); });
  for (auto& chunk : r.chunks) {
    chunk->set_params_ready_hook([optimizer](const torch::nn::Module& part) { optimizer->wait_for_params(part); });
    chunk->set_params_used_hook([optimizer](const torch::nn::Module& part, const std::vector<torch::Tensor>& outputs) {
      optimizer->release_params(part, outputs);
    });
  }
}

void build_optimizer(RunParts& r, std::vector<NamedParam> params, bool first_writes) {
  const Config& c = r.config;
  const auto& d = c.distributed;
  std::vector<torch::Tensor> byte_params;
  if (r.fp8 && c.precision.fp8.param_gather && r.fp8->num_sites() > 0) {
    r.fp8_param_gather = std::make_unique<Fp8ParamGather>(r.fp8);
    byte_params = r.fp8_param_gather->params();
  }
  // --num-distributed-optimizer-instances: the optimizer's copies (collective: every rank builds the groups).
  const DataParallelInstances instances =
      build_data_parallel_instances(r.parallel, r.data_parallel.dp, d.optimizer_instances, c.model.moe.enabled());
  r.optimizer = std::make_unique<MixedPrecisionOptimizer>(params, c.optimizer, c.precision, r.data_parallel,
                                                          d.distributed_optimizer, c.model.moe.enabled(), byte_params,
                                                          instances, d.shard_grads());
  if (r.fp8_param_gather)
    r.optimizer->enable_byte_publish(
        [gather = r.fp8_param_gather.get()](const OptimizerDomain& domain) { return gather->publish(domain); });
  if (r.fp8_param_gather)
    log::info(" > --fp8-param-gather: FP8 weights gathered as codes: " + r.fp8_param_gather->describe());
  const ModelConfig& m = c.model;
  r.optimizer->count_zeros(c.logging.log_num_zeros_in_grad);
  if (d.all_reduce_sharded_grads()) r.optimizer->all_reduce_sharded_grads();
  r.optimizer->set_qkv_rows({m.num_attention_heads / m.num_query_groups * m.kv_channels, m.kv_channels, m.kv_channels});
  if (const auto& queue = r.main_grads->wgrad_queue()) {
    // The held weight gradients complete their buckets when they have run, not when autograd
    // passes the weights (and, sharded, keep their units' gradients whole until the step's end).
    r.optimizer->complete_grads_later(r.main_grads->delayed_params());
    MixedPrecisionOptimizer* optimizer = r.optimizer.get();
    queue->set_on_done([optimizer](DeferredWork::Key param) { optimizer->grad_done(param); });
  }
  if (d.shard_grads()) shard_weights(r);  // (--overlap-param-gather: the units prefetch)
  if (d.overlap_grad_reduce) r.optimizer->enable_grad_overlap(d.bucket_numel);
  skip_zeroing_gemm_written_grads(r, first_writes);
  if (!d.shard_grads() && d.overlap_param_gather)
    r.optimizer->enable_param_gather_overlap(d.bucket_numel, d.overlap_param_gather_with_optimizer_step);
  if (r.optimizer->param_gather_overlapped()) {
    MixedPrecisionOptimizer* optimizer = r.optimizer.get();
    for (auto& chunk : r.chunks)
      chunk->set_params_ready_hook([optimizer](const torch::nn::Module& part) { optimizer->wait_for_params(part); });
  }
}

// The expert sites' slots of the delayed-scaling state, reduced over their own group.
void find_expert_amax_slots(RunParts& r) {
  if (!r.fp8 || !r.moe) return;
  const OptimizerDomain& experts = *r.optimizer->domains().back();
  std::vector<int64_t> slots;
  for (const auto& site : r.fp8->sites())
    if (experts.holds(site->parameter))
      for (auto role : {fp8::TensorRole::kInput, fp8::TensorRole::kWeight, fp8::TensorRole::kOutput,
                        fp8::TensorRole::kGradOutput, fp8::TensorRole::kGradInput})
        slots.push_back(int64_t(r.fp8->slot(*site, role)));
  if (!slots.empty()) r.expert_amax_slots = torch::tensor(slots, torch::kInt64).to(r.device);
}

// --overlap-moe-expert-parallel-comm with a virtual pipeline: the pipeline runs its steady-state
// steps as pairs taking turns (without a pipeline the combined 1F1B schedule runs the micro-batches).
CombinedSteps combined_steps(const RunParts& r) {
  if (!r.a2a_turns || r.parallel.sizes.pp == 1) return {};
  return CombinedSteps{r.a2a_turns.get(), r.device, r.run_held_wgrads};
}

void build_pipeline(RunParts& r, Timers& timers) {
  const Config& c = r.config;
  const auto& d = c.distributed;
  const int64_t s = c.model.seq_length / r.parallel.sizes.cp / (r.parallel.sequence_parallel ? r.parallel.sizes.tp : 1);
  r.pipeline = std::make_unique<PipelineSchedule>(r.parallel, d.virtual_stages,
                                                  std::vector<int64_t>{s, c.training.micro_batch_size, c.model.hidden_size},
                                                  param_dtype(c), r.device,
                                                  PipelineOverlap{d.overlap_p2p, d.overlap_p2p_warmup_flush},
                                                  combined_steps(r));
  if (timers.enabled(1) && r.parallel.sizes.pp > 1) {
    // The stall of the pipeline's receives (what --overlap-p2p-communication hides).
    r.pp_comm_timer = std::make_shared<overlap::CommTimer>(r.device.is_cuda());
    for (auto* senders : {&r.parallel.forward_senders, &r.parallel.backward_senders})
      for (auto& comm : *senders) comm->set_wait_observer(r.pp_comm_timer);
  }
}

// The expert-parallel group's wait observer: the exposed-time timer, behind the turn passing of the
// combined 1F1B schedule when the overlap is on.
void build_expert_comm_overlap(RunParts& r, Timers& timers) {
  if (r.parallel.sizes.ep <= 1) return;
  if (timers.enabled(1)) r.ep_comm_timer = std::make_shared<overlap::CommTimer>(r.device.is_cuda());
  if (r.config.model.moe.overlap_expert_parallel_comm) {
    if (const std::string why = r.parallel.transport->two_threads_refusal(); !why.empty())
      throw UserError("--overlap-moe-expert-parallel-comm: " + why);
    r.a2a_turns = std::make_shared<AllToAllTurns>();
    if (auto queue = r.main_grads->wgrad_queue()) {
      // Megatron's backward_dw: the GEMMs fill the time the backward pass's own all-to-all (the
      // dispatch's, or the next layer's combine) is in flight.
      r.run_held_wgrads = [queue, &timers] {
        if (queue->empty()) return;
        timers.start("delayed-wgrad-compute", 2);
        queue->run();
        timers.stop("delayed-wgrad-compute", 2);
      };
    }
    r.parallel.ep->set_wait_observer(std::make_shared<TurnAtAllToAll>(r.a2a_turns, r.ep_comm_timer, r.run_held_wgrads));
  } else if (r.ep_comm_timer) {
    r.parallel.ep->set_wait_observer(r.ep_comm_timer);
  }
}

// The data-parallel groups' wait observer: every data-parallel-type group of more than one rank
// (data x context parallel, expert data parallel, the distributed optimizer's instances) whose
// communicator no other feature observes. After the other groups' observers: a shared
// communicator keeps theirs (the expert-parallel turns are what the all-to-all overlap runs on).
void build_data_parallel_comm_timer(RunParts& r, Timers& timers) {
  if (!timers.enabled(1)) return;
  std::vector<std::shared_ptr<Communicator>> groups = {r.data_parallel.dp, r.parallel.expert_dp};
  for (const auto& domain : r.optimizer->domains())
    for (const auto& g : {domain->groups().dp, domain->groups().shard, domain->groups().instances}) groups.push_back(g);
  std::set<Communicator*> seen;
  for (const auto& g : groups) {
    if (!g || g->size() <= 1 || !seen.insert(g.get()).second || g->has_wait_observer()) continue;
    if (!r.dp_comm_timer) r.dp_comm_timer = std::make_shared<overlap::CommTimer>(r.device.is_cuda());
    g->set_wait_observer(r.dp_comm_timer);
  }
}

void build_loaders(RunParts& r) {
  const Config& c = r.config;
  const auto& t = c.training;
  std::shared_ptr<SampleSource> source = make_source(c), valid_source = source;
  if (c.data.dataloader_type == DataloaderType::Cyclic) {
    // Sized as the files are, or (built-in and mock data) as Megatron sizes the splits; the
    // validation split's sampler takes the evaluation micro-batch (Megatron's data_samplers).
    const auto sizes = split_samples(t);
    const auto inner = source;
    source = std::make_shared<CyclicSource>(inner, sizes, t.micro_batch_size, r.parallel.sizes.dp, c.data.data_sharding);
    valid_source = t.eval_micro_batch_size == t.micro_batch_size
                       ? source
                       : std::make_shared<CyclicSource>(inner, sizes, t.eval_micro_batch_size, r.parallel.sizes.dp,
                                                        c.data.data_sharding);
  }
  BatchOptions batch;
  batch.seq_length = c.model.seq_length;
  batch.micro_batch_size = c.training.micro_batch_size;
  batch.eod = c.data.eod;
  batch.eod_mask_loss = c.data.eod_mask_loss;
  batch.reset_position_ids = c.data.reset_position_ids;
  batch.reset_attention_mask = c.data.reset_attention_mask;
  batch.pad = c.data.pad;
  batch.create_attention_mask = c.data.create_attention_mask;
  batch.prefetch = c.data.num_workers;
  batch.stride = c.training.micro_batch_size * r.parallel.sizes.dp;
  batch.vocab_size = c.model.vocab_size;
  r.train_loader = std::make_unique<BatchLoader>(source, Split::Train, batch, r.device);
  BatchOptions eval_batch = batch;  // --eval-micro-batch-size
  eval_batch.micro_batch_size = t.eval_micro_batch_size;
  eval_batch.stride = t.eval_micro_batch_size * r.parallel.sizes.dp;
  r.valid_loader = std::make_unique<BatchLoader>(valid_source, Split::Valid, eval_batch, r.device);
}

void build_rerun_engine(RunParts& r) {
  const Config& c = r.config;
  const RerunConfig& rc = c.training.rerun;
  std::string node = rc.test_node_name;
  if (node.empty()) {
    char host[256] = {};
    gethostname(host, sizeof host - 1);
    node = host;
  }
  rerun::Hardware hardware{node, r.device.is_cuda() ? int(r.device.index()) : -1};
  r.numerics = std::make_unique<NumericsGuard>(r.device);
  r.rerun = std::make_unique<rerun::RerunStateMachine>(
      rc, rerun::validation_calls(c.training.numerics), r.parallel.world_rank, r.parallel.sizes.world_size, hardware,
      c.training.seed, !c.checkpoint.save.empty(), [&r](const std::vector<bool>& flags) { return r.any_rank(flags); });
  r.iterations_to_skip.insert(c.training.iterations_to_skip.begin(), c.training.iterations_to_skip.end());
}

}  // namespace

std::unique_ptr<RunParts> build_run_parts(const Config& c, const TrainOptions& options, Timers& timers) {
  auto r = std::make_unique<RunParts>(c);
  if (r->device.is_cuda()) {
    c10::cuda::set_device(r->device.index());
    configure_attention_backends();
  }
  // Before the first NCCL communicator and cuBLAS handle: it sets the environment they read.
  if (c.training.deterministic) r->deterministic.emplace(r->device);
  r->parallel = make_parallel_state(c, options.force_single_process);
  lock_save_dirs(*r);
  torch::manual_seed(c.training.seed + 100 * uint64_t(r->parallel.pp_rank));  // dropout streams, as Megatron seeds them
  build_context_parallel(*r);
  if (timers.enabled(1) && r->parallel.sizes.tp > 1) {
    r->tp_comm_timer = std::make_shared<overlap::CommTimer>(r->device.is_cuda());
    r->parallel.tp->set_wait_observer(r->tp_comm_timer);
  }
  build_fp8_and_moe(*r, timers);
  r->main_grads = make_main_grads(c.precision.gradient_accumulation_fusion);
  if (c.model.moe.delay_wgrad_compute) r->main_grads->set_wgrad_queue(std::make_shared<DeferredWork>());
  build_optimizer(*r, build_chunks(*r), options.main_grad_first_writes);
  find_expert_amax_slots(*r);
  build_expert_comm_overlap(*r, timers);
  build_pipeline(*r, timers);
  build_data_parallel_comm_timer(*r, timers);
  build_loaders(*r);
  if (c.training.cuda_graph.full_iteration)
    r->step_graph = std::make_unique<StepGraph>(
        c.training.cuda_graph.warmup_steps, r->device,
        r->fp8 ? std::vector<fp8::GemmHandle*>{&r->fp8->gemm_handle()} : std::vector<fp8::GemmHandle*>{});
  build_rerun_engine(*r);
  return r;
}

}  // namespace fp8tron
