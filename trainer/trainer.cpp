// The training loop (Megatron's train()): iterations until --train-iters or an exit condition,
// each one the step (training_step.h), then the reports (run_reporter.h), evaluation, and the
// checkpoint and exit decision (run_checkpoints.h), over the parts built once from the
// configuration (run_parts.h).
#include "trainer/trainer.h"

#include <chrono>
#include <cstdio>
#include <optional>

#include "checkpoint/fault_points.h"
#include "core/error.h"
#include "core/log.h"
#include "core/text.h"
#include "models/model_plan.h"
#include "trainer/cli/config_builder.h"
#include "trainer/exit_signal.h"
#include "trainer/profiling.h"
#include "trainer/run_checkpoints.h"
#include "trainer/run_parts.h"
#include "trainer/run_progress.h"
#include "trainer/run_reporter.h"
#include "trainer/training_step.h"
#include "trainer/wandb_run.h"
#include "trainer/weight_hash_check.h"

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

// The global (tensor-parallel-gathered) fp32 value of each of this rank's parameters, and a few
// values of each in `sample` (determinism tests compare those).
std::map<std::string, torch::Tensor> global_weights(RunParts& parts, std::vector<double>* sample = nullptr) {
  torch::NoGradGuard no_grad;
  parts.optimizer->gather_all_params();
  std::map<std::string, torch::Tensor> out;
  for (auto& chunk : parts.chunks) {
    const auto infos = chunk->param_infos();
    for (const auto& item : chunk->named_parameters()) {
      const ParamInfo& info = infos.at(item.key());
      Communicator& group = info.expert ? *parts.parallel.expert_tp : *parts.parallel.tp;  // experts: sharded over expert TP
      auto global = gather_global_param(item.value().detach().to(torch::kFloat32), info, group).cpu();
      if (!info.shared_embedding_copy) out[item.key()] = global;
      if (!sample) continue;
      auto flat = global.reshape({-1}).to(torch::kFloat64);
      sample->push_back(flat[0].item<double>());
      sample->push_back(flat.sum().item<double>());
    }
  }
  parts.optimizer->release_all_params();
  return out;
}

// --check-weight-hash-across-dp-replicas-interval: every replica's weights hash alike.
void check_weight_hashes_across_replicas(RunParts& parts, int64_t iteration) {
  parts.optimizer->gather_all_params();  // optim_grads' units hold the weights from their first use on
  std::vector<std::pair<std::string, torch::Tensor>> params, experts;
  for (auto& chunk : parts.chunks) {
    const auto infos = chunk->param_infos();
    for (const auto& item : chunk->named_parameters())
      (infos.at(item.key()).expert ? experts : params).emplace_back(item.key(), item.value());
  }
  log::print(check_weight_hashes(params, experts, parts.parallel, iteration));
  parts.optimizer->release_all_params();
}

// --print-model-plan: how this pipeline rank's chunks run, module by module. The first rank of each
// stage prints it (the other tensor-, context- and data-parallel ranks run the same plan).
std::string model_plan_text(const RunParts& parts) {
  const auto& p = parts.parallel;
  std::string text = strprintf("model plan, pipeline rank %d of %d:\n", p.pp_rank, p.sizes.pp);
  for (size_t i = 0; i < parts.chunks.size(); ++i) {
    if (parts.chunks.size() > 1) text += strprintf(" virtual pipeline chunk %zu:\n", i);
    text += format_model_plan(model_plan(*parts.chunks[i]));
  }
  return text;
}

void print_model_plan(const std::string& text, const ParallelState& p) {
  if (p.tp_rank != 0 || p.cp_rank != 0 || p.dp_rank != 0) return;
  std::fputs(text.c_str(), stdout);
  std::fflush(stdout);
}

// Sharded weights and gradients (optim_grads_params): what this rank holds between uses and at most, once.
void log_sharded_weight_memory(const RunParts& parts) {
  const ShardedWeightBytes b = parts.optimizer->sharded_weight_bytes();
  constexpr double kMiB = 1024.0 * 1024.0;
  log::print(strprintf("sharded weights (rank %d): %.2f MiB kept between uses, at most %.2f MiB gathered at once, "
                       "%.2f MiB unsharded",
                       parts.parallel.world_rank, double(b.shard) / kMiB, double(b.peak) / kMiB, double(b.total) / kMiB));
  if (b.grad_total > 0)
    log::print(strprintf("sharded gradients (rank %d): %.2f MiB fp32 shard, at most %.2f MiB of unit gradients at once, "
                         "%.2f MiB unsharded",
                         parts.parallel.world_rank, double(b.grad_shard) / kMiB, double(b.grad_peak) / kMiB,
                         double(b.grad_total) / kMiB));
}

// Megatron's rule: every --eval-interval iterations, from --start-eval-at-iter on.
bool evaluation_due(const RunParts& parts, int64_t iteration) {
  const auto& t = parts.config.training;
  return t.eval_iters > 0 && parts.valid_loader->has_data() && iteration % t.eval_interval == 0 &&
         (!t.start_eval_at_iter || iteration >= *t.start_eval_at_iter);
}

TrainResult run_training(const Config& c, const TrainOptions& options) {
  // Before the model is built: a W&B run that cannot start stops the job here.
  std::unique_ptr<WandbWriter> wandb = start_wandb_run(c);
  std::unique_ptr<RunParts> owned;
  Timers timers(c.logging.timing_log_level, [&owned] { if (owned) owned->synchronize(); });
  owned = build_run_parts(c, options, timers);
  RunParts& parts = *owned;
  RunProgress progress(c, parts.parallel.sizes.dp);
  RunReporter reporter(parts, progress, timers, std::move(wandb));
  reporter.log_start();
  if (c.print_model_plan) {
    TrainResult planned;
    planned.model_plan = model_plan_text(parts);
    print_model_plan(planned.model_plan, parts.parallel);
    return planned;
  }
  RunCheckpoints checkpoints(parts, progress);
  TrainingStep step(parts, progress, timers, checkpoints, reporter);

  const int64_t first_iteration = checkpoints.load();
  TrainResult result;
  if (!c.checkpoint.convert_format.empty()) {
    // Megatron's --ckpt-convert-format: the loaded checkpoint saved again in the other format, no training.
    result.iterations = first_iteration - 1;
    checkpoints.save(result.iterations);
    checkpoints.finish();  // an --async-save one committed before the run ends
    log::print(" > converted checkpoint: " + c.checkpoint.load + " -> " + c.checkpoint.save);
    return result;
  }
  if (options.collect_initial_weights) result.initial_weights = global_weights(parts);
  std::optional<ExitSignalHandler> exit_signal;
  // Megatron installs --exit-signal-handler-for-training's handler last: it wins for SIGTERM.
  if (c.checkpoint.exit_signal_handler_for_training) exit_signal.emplace(std::vector<int>{SIGINT, SIGTERM}, false);
  else if (c.checkpoint.exit_signal_handler) exit_signal.emplace(std::vector<int>{c.checkpoint.exit_signal}, true);
  StepProfiler profiler(c.profiling, parts.parallel.world_rank, c.logging.tensorboard_dir, parts.device.is_cuda());
  const auto& t = c.training;
  result.iterations = first_iteration - 1;
  if (t.weight_hash_interval) check_weight_hashes_across_replicas(parts, result.iterations);
  std::vector<torch::Tensor> losses, grad_norms;
  losses.reserve(size_t(t.train_iters));
  log::print("training ...");
  const auto start = Clock::now();
  auto interval_start = start;
  int64_t interval_iterations = 0;
  for (int64_t iteration = first_iteration; iteration <= t.train_iters; ++iteration) {
    profiler.before_iteration(iteration, [&parts] { parts.synchronize(); });
    step.update_batch_size(iteration);
    if (parts.iterations_to_skip.count(iteration)) {
      // Megatron's skip: nothing else of the loop runs (no log line, save or exit check).
      step.skip(iteration);
      result.iterations = iteration;
      if (parts.parallel.progress) parts.parallel.progress->iteration_finished(iteration);
      continue;
    }
    losses.push_back(step.run(iteration));
    if (iteration == first_iteration && parts.optimizer->params_sharded()) log_sharded_weight_memory(parts);
    if (options.collect_grad_norms)
      grad_norms.push_back(progress.last_step.grad_norm.defined() ? progress.last_step.grad_norm.detach().clone()
                                                                  : torch::full({}, std::nan(""), torch::kFloat64));
    if (parts.moe) reporter.report_moe(iteration);
    ++interval_iterations;
    result.iterations = iteration;
    if (parts.parallel.progress) parts.parallel.progress->iteration_finished(iteration);
    if (reporter.training_scalars_due(iteration)) reporter.write_training_scalars(iteration, losses.back());
    if (reporter.fp8_stats_due(iteration)) reporter.log_fp8_stats(iteration);
    if (iteration % c.logging.log_interval == 0) {
      parts.synchronize();
      reporter.log_interval(iteration, std::chrono::duration<double>(Clock::now() - interval_start).count(),
                            interval_iterations);
      interval_start = Clock::now();
      interval_iterations = 0;
    }
    if (evaluation_due(parts, iteration)) {
      const auto eval_start = Clock::now();
      result.last_validation_loss = step.evaluate();
      reporter.log_validation(iteration, result.last_validation_loss, /*at_end=*/false);
      interval_start += Clock::now() - eval_start;  // evaluation time is not training time
    }
    if (t.weight_hash_interval && iteration % *t.weight_hash_interval == 0) check_weight_hashes_across_replicas(parts, iteration);
    const auto decide_start = Clock::now();
    const bool exit = checkpoints.save_and_decide_exit(iteration, start, exit_signal ? &*exit_signal : nullptr);
    interval_start += Clock::now() - decide_start;  // neither is saving
    if (exit) break;
  }
  profiler.finish();  // a window that reaches past the last iteration ends here
  // As Megatron: a checkpoint at the end of training unless the last iteration was just saved.
  const bool shutdown = checkpoints.shutting_down();  // --exit-signal-handler-for-training: no save, no evaluation
  if (!shutdown && !c.checkpoint.save.empty() && result.iterations >= first_iteration &&
      progress.last_saved_iteration != result.iterations)
    checkpoints.save(result.iterations);
  checkpoints.finish();
  if (!shutdown && t.eval_iters > 0 && parts.valid_loader->has_data() && result.iterations % t.eval_interval != 0) {
    result.last_validation_loss = step.evaluate();
    reporter.log_validation(result.iterations, result.last_validation_loss, /*at_end=*/true);
  }
  parts.optimizer->finish_param_gather();  // the weights are complete when training returns
  parts.synchronize();
  for (const auto& l : losses) result.losses.push_back(l.item<double>());
  for (const auto& g : grad_norms) result.grad_norms.push_back(g.item<double>());
  result.moe_losses = reporter.moe_history();
  result.mtp_losses = reporter.mtp_history();
  result.consumed_samples = progress.consumed_train_samples;
  if (parts.step_graph) result.cuda_graph_replays = parts.step_graph->replayed();
  result.main_grad_first_writes = parts.main_grads->granted();
  for (auto& chunk : parts.chunks)
    if (chunk->offloader())
      for (const auto& [module, bytes] : chunk->offloader()->bytes_by_module()) result.activation_offload_bytes[module] += bytes;
  result.param_gathers_during_step = parts.optimizer->param_gathers_during_step();
  const ShardedWeightBytes sharded = parts.optimizer->sharded_weight_bytes();
  result.sharded_weights_peak_bytes = sharded.peak;
  result.sharded_weights_total_bytes = sharded.total;
  result.sharded_grads_peak_bytes = sharded.grad_peak;
  result.sharded_grads_total_bytes = sharded.grad_total;
  // Gathering every global weight to the host is for tests; a real run skips it.
  if (options.collect_final_weights) result.final_weights = global_weights(parts, &result.final_weights_sample);
  reporter.finish();
  return result;
}

}  // namespace

TrainResult train(const Config& config, const TrainOptions& options) {
  require_supported(config);
  if (!config.checkpoint.test_kill_at.empty()) checkpoint::arm_fault_point(config.checkpoint.test_kill_at);
  return run_training(config, options);
}

}  // namespace fp8tron
