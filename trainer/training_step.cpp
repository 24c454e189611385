#include "trainer/training_step.h"

#include <cmath>
#include <optional>
#include <sstream>

#include "checkpoint/rank_agreement.h"
#include "core/error.h"
#include "core/log.h"
#include "core/text.h"
#include "parallel/combined_schedule.h"
#include "parallel/context_parallel.h"

namespace fp8tron {
namespace {

std::string value_text(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return strprintf("%.6E", v);
}

// What a user whose job stopped for a re-run elsewhere can do on this machine instead: the fault's
// checkpoint asks for a re-run, the one saved before it (kept by retention) does not.
std::string way_back_after_fault(int64_t saved_for_rerun, std::optional<int64_t> saved_before) {
  if (saved_before && *saved_before < saved_for_rerun)
    return strprintf(". The last checkpoint from before the fault is iteration %lld: to go on here, resume it with "
                     "--ckpt-step %lld and a lower --lr or other data, or resume iteration %lld with --rerun-mode "
                     "disabled to skip the re-run protocol",
                     (long long)*saved_before, (long long)*saved_before, (long long)saved_for_rerun);
  return strprintf(". To go on here, resume iteration %lld with --rerun-mode disabled (it skips the re-run protocol) "
                   "and a lower --lr or other data",
                   (long long)saved_for_rerun);
}

}  // namespace

TrainingStep::TrainingStep(RunParts& parts, RunProgress& progress, Timers& timers, RunCheckpoints& checkpoints,
                           RunReporter& reporter)
    : parts_(parts), c_(parts.config), progress_(progress), timers_(timers), checkpoints_(checkpoints), reporter_(reporter) {}

void TrainingStep::update_batch_size(int64_t iteration) {
  // Megatron's order: the micro-batch count first (a change saves a checkpoint), then the
  // divisibility of the current batch (which only a step schedule can break at this point).
  const int64_t micro_dp = c_.training.micro_batch_size * parts_.parallel.sizes.dp;
  const int64_t micro = progress_.batches.micro_batches(progress_.consumed_train_samples);
  if (progress_.micro_batches != 0 && micro != progress_.micro_batches) {
    if (micro < progress_.micro_batches)  // a step schedule whose batch falls; Megatron asserts the same
      throw UserError(strprintf("Number of microbatches should not decrease; going from %lld to %lld "
                                "(--step-batch-size-schedule: the batch sizes must not fall)",
                                (long long)progress_.micro_batches, (long long)micro));
    log::info(strprintf("ramping up batch size from %lld to %lld", (long long)(progress_.micro_batches * micro_dp),
                        (long long)progress_.batches.running_batch(progress_.consumed_train_samples)));
    // Megatron saves a checkpoint whenever the micro-batch count changes.
    if (!c_.checkpoint.save.empty() && iteration > 1 && progress_.last_saved_iteration != iteration - 1)
      checkpoints_.save(iteration - 1);
  } else if (progress_.micro_batches == 0 && progress_.batches.ramps()) {
    log::info(strprintf("setting initial batch size to %lld", (long long)progress_.batches.global_batch(progress_.consumed_train_samples)));
  }
  if (progress_.batches.running_batch(progress_.consumed_train_samples) % micro_dp != 0)
    throw UserError(strprintf("current global batch size (%lld) is not divisible by micro_batch_size (%lld) * "
                              "data_parallel_size (%lld)",
                              (long long)progress_.batches.running_batch(progress_.consumed_train_samples),
                              (long long)c_.training.micro_batch_size, (long long)parts_.parallel.sizes.dp));
  progress_.micro_batches = micro;
  progress_.current_global_batch = progress_.batches.global_batch(progress_.consumed_train_samples);
}

torch::Tensor TrainingStep::run(int64_t iteration) {
  progress_.iteration = iteration;
  if (parts_.fp8) parts_.fp8->collect_stats(reporter_.fp8_stats_due(iteration));
  const rerun::PassPlan plan = parts_.rerun->begin_iteration(iteration);
  std::optional<StepSnapshot> snapshot;
  if (plan.snapshot) snapshot.emplace(parts_.device, parts_.fp8.get(), parts_.model_buffers());
  Pass pass = forward_backward(iteration);
  torch::Tensor values = plan.judge ? parts_.numerics->values(pass.loss, pass.prepared.grad_norm) : torch::Tensor();
  // The copy of the values is queued before the step, so that the wait below ends when they exist,
  // while the GPU still has the optimizer step to run.
  if (plan.judge) parts_.numerics->start_read(values);
  bool stepped = plan.step_now;
  if (plan.step_now)
    progress_.last_step = apply(pass, plan.device_rejection ? parts_.numerics->rejection(values, parts_.rerun->calls(), plan) : torch::Tensor());
  while (plan.judge) {
    // The one wait for the device per iteration: the two values, after the step was queued.
    const auto [loss, grad_norm] = parts_.numerics->finish_read();
    const rerun::PassOutcome outcome = parts_.rerun->after_pass(loss, grad_norm);
    if (outcome.kind == rerun::PassOutcome::Kind::kStop)
      end_run(iteration, outcome, snapshot ? &*snapshot : nullptr, loss, grad_norm);
    if (outcome.kind == rerun::PassOutcome::Kind::kAccept) {
      if (outcome.step && !stepped) progress_.last_step = apply(pass, torch::Tensor());
      break;
    }
    // Again from the same state: the rejected pass's step was skipped on the device, so the
    // weights and the optimizer state are those before the iteration.
    FP8TRON_CHECK(snapshot.has_value(), "a re-run in place without a snapshot");
    snapshot->restore(parts_.moe.get());
    if (parts_.fp8_param_gather) parts_.optimizer->publish_model_params();  // FP8 weights cast with the restored scales
    pass = forward_backward(iteration);
    values = parts_.numerics->values(pass.loss, pass.prepared.grad_norm);
    parts_.numerics->start_read(values);
    stepped = false;
  }
  // The data-parallel waits fall in the optimizer phases too (the gradient reductions, the step's
  // parameter all-gather), which the "optimizer" timer synchronized after: their events are complete.
  if (parts_.dp_comm_timer) timers_.add("dp-comm-exposed", 1, parts_.dp_comm_timer->take_ms());
  account(pass);
  if (parts_.fp8) parts_.fp8->collect_stats(false);  // evaluation's casts are not the step's
  return pass.loss;
}

TrainingStep::Pass TrainingStep::forward_backward(int64_t iteration) {
  const auto& t = c_.training;
  timers_.start("forward-backward", 1);
  if (parts_.moe) parts_.moe->take_dispatch_bytes();  // evaluation's dispatches are not the step's
  const int64_t micro = progress_.micro_batches;
  // --cuda-graph-impl full_iteration: after its warm-up steps the passes run as one CUDA graph
  // (trainer/step_graph.h). A replay repeats the first writes of the capture, whose record the
  // registry keeps. A step that logs the FP8 casts' statistics runs eagerly: the host reads them.
  const bool logs_fp8_stats = parts_.fp8 && parts_.fp8->collecting_stats();
  const bool graphed = parts_.step_graph && !logs_fp8_stats && parts_.step_graph->take_step(micro);
  parts_.optimizer->zero_grad();
  if (!(graphed && parts_.step_graph->replays(micro))) parts_.main_grads->new_step();
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
      per_token ? progress_.scaler.scale() : progress_.scaler.scale() / double(micro * (average_after ? 1 : parts_.parallel.sizes.dp));
  auto loss_tokens = torch::zeros({}, torch::TensorOptions().device(parts_.device).dtype(torch::kFloat32));
  // The auxiliary losses' backward starts with the factors the lm loss gets (Megatron's
  // loss_scale x cp / micro-batches, or loss_scale with --calculate-per-token-loss; and the 1 / DP
  // its data-parallel average applies to them).
  if (parts_.moe) parts_.moe->set_aux_grad_scale(backward_scale);
  torch::Tensor loss_sum;
  if (graphed) {
    std::vector<Batch> batches;
    for (int64_t mb = 0; mb < micro; ++mb)
      batches.push_back(load_micro_batch(*parts_.train_loader, mb, progress_.consumed_train_samples, t.micro_batch_size));
    parts_.step_graph->stage(batches);
    const auto outputs = parts_.step_graph->run(micro, [&] {
      auto tokens = torch::zeros({}, loss_tokens.options());
      auto sum = run_micro_batches(micro, backward_scale, [&](int64_t mb) { return parts_.step_graph->staged(mb); }, &tokens);
      return std::vector<torch::Tensor>{sum, tokens};
    });
    // The graph's outputs are overwritten by the next replay (a re-run of this iteration).
    loss_sum = outputs[0].clone();
    loss_tokens = outputs[1].clone();
  } else {
    loss_sum = run_micro_batches(
        micro, backward_scale,
        [&](int64_t mb) {
          return load_micro_batch(*parts_.train_loader, mb, progress_.consumed_train_samples, t.micro_batch_size);
        },
        &loss_tokens);
  }
  timers_.stop("forward-backward", 1);
  if (t.numerics.test_nan_iteration == iteration && !t.numerics.test_nan_param.empty()) inject_nan_gradient();
  // After the timer's synchronization: the step's communication events are complete.
  if (parts_.tp_comm_timer) timers_.add("tp-comm-exposed", 1, parts_.tp_comm_timer->take_ms());
  if (parts_.pp_comm_timer) timers_.add("pp-comm-exposed", 1, parts_.pp_comm_timer->take_ms());
  if (parts_.ep_comm_timer) timers_.add("ep-comm-exposed", 1, parts_.ep_comm_timer->take_ms());
  // The bytes the alltoall dispatcher's forward all-to-alls sent to other ranks (FP8 codes and
  // scales with --moe-dispatch-fp8), measured at the exchange.
  if (parts_.moe) timers_.add_count("moe-dispatch-all-to-all", 1, double(parts_.moe->take_dispatch_bytes()));
  // The bytes --fine-grained-activation-offloading copied to host memory in this step's forward passes.
  if (parts_.config.model.offload.enabled) {
    int64_t offloaded = 0;
    for (auto& chunk : parts_.chunks)
      if (chunk->offloader()) offloaded += chunk->offloader()->take_offloaded_bytes();
    timers_.add_count("activation-offload", 1, double(offloaded));
  }

  timers_.start("optimizer", 1);
  parts_.main_grads->zero_unwritten();  // before the reductions read them
  parts_.optimizer->finalize_grads();
  if (parts_.moe) parts_.moe->end_step();  // expert-bias update from the step's token counts (Megatron: finalize_model_grads)
  // Averaged before the step: with --overlap-param-gather the step leaves the weights' all-gathers
  // in flight on the data-parallel group, and a collective queued behind them would wait for all.
  if (per_token) loss_tokens = global_token_count(loss_tokens);
  Pass pass;
  pass.loss = average_loss(loss_sum, micro, loss_tokens);
  pass.mtp = mtp_losses(micro);
  // New scales (delayed scaling) and new weights to quantize before the step: --fp8-param-gather
  // casts the new weights with them in the step (as the next forward would), and the amax
  // reduction does not queue behind --overlap-param-gather's gathers.
  if (parts_.fp8) end_fp8_step();
  // The optimizer divides the gradients by this before the norm and the update; none when it is 1
  // (bf16 without per-token loss on one data-parallel rank: a pass over every gradient saved).
  const double divisor = progress_.scaler.scale() * (average_after ? double(parts_.parallel.sizes.dp) : 1.0);
  torch::Tensor grad_divisor;
  if (per_token) grad_divisor = torch::full({}, divisor, loss_tokens.options()) * loss_tokens.clamp_min(1.0);
  else if (divisor != 1.0) grad_divisor = torch::full({}, divisor, loss_tokens.options());
  pass.prepared = parts_.optimizer->prepare_step(grad_divisor);
  timers_.stop("optimizer", 1);
  return pass;
}

StepResult TrainingStep::apply(Pass& pass, const torch::Tensor& skip) {
  const OptimizerConfig& o = c_.optimizer;
  GroupLrs group_lrs;
  if (o.decoupled_lr) group_lrs.decoupled = progress_.schedule.lr(*o.decoupled_lr, o.decoupled_min_lr.value_or(o.min_lr));
  // MuP's group: Megatron overrides its peak and minimum, so warmup still starts at --lr-warmup-init.
  if (const auto mult = mup_lr_mult(o)) group_lrs.mup = progress_.schedule.lr(o.lr * *mult, o.min_lr * *mult);
  timers_.start("optimizer", 1);
  StepResult result = parts_.optimizer->apply_step(pass.prepared, progress_.schedule.lr(), progress_.schedule.weight_decay(), group_lrs, skip);
  timers_.stop("optimizer", 1);
  return result;
}

void TrainingStep::account(const Pass& pass) {
  const auto& t = c_.training;
  bool advance_schedule = true;
  if (progress_.scaler.dynamic()) {
    // fp16: the scaler needs the overflow flag now (Megatron waits here too).
    const bool found_inf = progress_.last_step.found_inf.item<float>() > 0;
    progress_.scaler.update(found_inf);
    advance_schedule = !found_inf;
  }
  // Megatron advances the schedule and the consumed samples by the batch actually run.
  const int64_t batch = progress_.micro_batches * t.micro_batch_size * parts_.parallel.sizes.dp;
  if (advance_schedule) progress_.schedule.step(batch);
  progress_.consumed_train_samples += batch;
  reporter_.add_step(pass.loss, pass.mtp);
}

void TrainingStep::skip(int64_t iteration) {
  const int64_t batch = progress_.micro_batches * c_.training.micro_batch_size * parts_.parallel.sizes.dp;
  progress_.consumed_train_samples += batch;
  progress_.skipped_train_samples += batch;
  log::info(strprintf(" > skipping iteration %lld (--iterations-to-skip): its %lld samples are consumed without a "
                      "step",
                      (long long)iteration, (long long)batch));
}

double TrainingStep::evaluate() {
  parts_.optimizer->finish_param_gather();  // as Megatron: evaluation does not overlap the gather
  for (auto& m : parts_.chunks) m->eval();
  const auto& t = c_.training;
  auto total = torch::zeros({}, torch::TensorOptions().device(parts_.device).dtype(torch::kFloat32));
  auto tokens = torch::zeros_like(total);
  for (int64_t i = 0; i < t.eval_iters; ++i) {
    const auto forward = [&](int chunk, int64_t mb, const torch::Tensor& input) {
      return forward_chunk(
          chunk, input,
          [&] { return load_micro_batch(*parts_.valid_loader, mb, progress_.consumed_valid_samples, t.eval_micro_batch_size); },
          &tokens);
    };
    total += parts_.pipeline->run_forward_only(t.eval_micro_batches, forward, t.eval_micro_batch_size);
    progress_.consumed_valid_samples += t.eval_global_batch_size;
  }
  for (auto& m : parts_.chunks) m->train();
  const double loss = t.calculate_per_token_loss
                         ? average_loss(total, 0, global_token_count(tokens)).item<double>()
                         : average_loss(total, t.eval_micro_batches, tokens).item<double>() /
                               double(std::max<int64_t>(1, t.eval_iters));
  for (auto* timer : {parts_.tp_comm_timer.get(), parts_.pp_comm_timer.get(), parts_.ep_comm_timer.get(),
                      parts_.dp_comm_timer.get()})
    if (timer) timer->take_ms();  // evaluation's waits are not a training step's
  return loss;
}

void TrainingStep::end_run(int64_t iteration, const rerun::PassOutcome& outcome, const StepSnapshot* snapshot, double loss,
                      double grad_norm) {
  const bool gradient = !std::isfinite(grad_norm);
  const std::string param = gradient ? first_nonfinite_grad_everywhere() : "";
  std::string where;
  if (!param.empty()) where = " (the first parameter whose gradient is not finite: " + param + ")";
  else if (gradient) where = " (every gradient element is finite: their squares overflow the norm)";
  std::string way_back;
  if (outcome.save_checkpoint) {
    // The state before the iteration (its step was skipped), with the record a restarted job reads.
    FP8TRON_CHECK(snapshot != nullptr, "a checkpoint for a re-run without a snapshot");
    snapshot->restore(parts_.moe.get());
    if (parts_.fp8_param_gather) parts_.optimizer->publish_model_params();
    std::string mine;
    for (const auto& [rank, hw] : parts_.rerun->own_suspect_entry())
      mine = strprintf("%d %d %s", rank, hw.device, hw.node.c_str());
    std::vector<std::pair<int, rerun::Hardware>> suspects;
    for (const std::string& entry : all_gather_strings(parts_.parallel, parts_.device, mine)) {
      if (entry.empty()) continue;
      std::istringstream in(entry);
      int rank = 0;
      rerun::Hardware hw;
      in >> rank >> hw.device;
      std::getline(in >> std::ws, hw.node);
      suspects.emplace_back(rank, hw);
    }
    parts_.rerun->set_suspects(suspects);
    const std::optional<int64_t> before = checkpoints_.save_for_rerun(iteration - 1, parts_.rerun->record());
    way_back = way_back_after_fault(iteration - 1, before);
  }
  // A save prepared before this step holds a good state: it is committed before stopping.
  checkpoints_.finish();
  if (outcome.exit_status != 1) {
    const bool fatal_gradient = outcome.failed_call && parts_.rerun->calls()[*outcome.failed_call].subject ==
                                                           rerun::Subject::kGradNorm && gradient;
    throw RunEnd(outcome.exit_status, outcome.conclusion + (fatal_gradient ? where : "") + way_back);
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

Batch TrainingStep::load_micro_batch(BatchLoader& loader, int64_t micro_batch, int64_t first_sample, int64_t mbs) {
  // Megatron's sampler: micro-batch m of data-parallel rank r starts at m*mbs*dp + r*mbs.
  const int64_t sample = first_sample + micro_batch * mbs * parts_.parallel.sizes.dp + parts_.parallel.dp_rank * mbs;
  timers_.start("batch-generator", 2);
  Batch batch = loader.load(sample);
  // Megatron's get_batch_on_this_cp_rank: every context-parallel rank loads the micro-batch and
  // keeps its shard of the sequence.
  if (parts_.cp.enabled())
    for (torch::Tensor* t : {&batch.tokens, &batch.labels, &batch.loss_mask, &batch.position_ids, &batch.segment_ids})
      if (t->defined()) *t = cp_shard(*t, 1, parts_.cp.size(), parts_.cp.rank());
  timers_.stop("batch-generator", 2);
  return batch;
}

torch::Tensor TrainingStep::forward_chunk(int chunk, const torch::Tensor& input, const BatchOf& batch_of,
                                     torch::Tensor* loss_tokens) {
  auto& model = parts_.chunks[size_t(chunk)];
  const StageSpec& stage = model->stage();
  // Middle stages need the batch only for the document mask of --reset-attention-mask.
  const bool document_mask = c_.data.reset_attention_mask && c_.data.create_attention_mask;
  if (!stage.has_embedding && !stage.has_head && !document_mask) return model->forward_stage(input, {}, {});
  const Batch batch = batch_of();
  if (stage.has_head && loss_tokens) *loss_tokens += batch.loss_mask.sum();
  torch::Tensor out = model->forward_stage(stage.has_embedding ? batch.tokens : input, batch.labels, batch.loss_mask,
                                           batch.position_ids, batch.segment_ids, batch.tokens);
  const NumericsChecks& n = c_.training.numerics;
  if (stage.has_head && model->is_training() && n.test_nan_iteration == progress_.iteration && n.test_nan_param.empty())
    out = out * std::nan("");  // --fp8tron-test-inject-nan ITER: a NaN loss, and so NaN gradients
  return out;
}

torch::Tensor TrainingStep::run_micro_batches(int64_t micro_batches, double backward_scale,
                                         const std::function<Batch(int64_t)>& batch_of, torch::Tensor* loss_tokens) {
  const int64_t turns_before = parts_.a2a_turns ? parts_.a2a_turns->passes() : 0;
  const auto& held_queue = parts_.main_grads->wgrad_queue();
  const int64_t held_before = held_queue ? held_queue->ran() : 0;
  if (parts_.a2a_turns && parts_.parallel.sizes.pp == 1) {  // --overlap-moe-expert-parallel-comm, no pipeline
    auto loss_sum = run_combined_1f1b(
        micro_batches, [&](int64_t mb) { return forward_chunk(0, {}, [&] { return batch_of(mb); }, loss_tokens); },
        backward_scale, [&] { parts_.optimizer->arm_grad_overlap(); }, *parts_.a2a_turns, parts_.device,
        parts_.run_held_wgrads);
    report_turns(turns_before, held_before, micro_batches);
    return loss_sum;
  }
  auto loss_sum = parts_.pipeline->run(
      micro_batches,
      [&](int chunk, int64_t mb, const torch::Tensor& input) {
        return forward_chunk(chunk, input, [&] { return batch_of(mb); }, loss_tokens);
      },
      backward_scale, [&] { parts_.optimizer->arm_grad_overlap(); }, c_.distributed.microbatch_group_size);
  // --defer-embedding-wgrad-compute: the last stage's output-layer weight gradients, while the
  // other stages finish the pipeline flush.
  for (auto& chunk : parts_.chunks) chunk->drain_output_wgrad();
  if (parts_.a2a_turns) report_turns(turns_before, held_before, micro_batches);  // the interleaved pipeline's pairs
  return loss_sum;
}

void TrainingStep::report_turns(int64_t turns_before, int64_t held_before, int64_t micro_batches) {
  if (reported_turns_) return;  // once: shows the overlap at work (and how finely it interleaves)
  std::string held;
  if (const auto& queue = parts_.main_grads->wgrad_queue())
    held = strprintf("; --delay-wgrad-compute: %lld held weight-gradient computations ran behind its all-to-alls "
                     "or at the ends of the backward passes",
                     (long long)(queue->ran() - held_before));
  log::info(strprintf("--overlap-moe-expert-parallel-comm: the combined 1F1B schedule took %lld turns at the "
                      "expert-parallel all-to-alls over %lld micro-batches%s",
                      (long long)(parts_.a2a_turns->passes() - turns_before), (long long)micro_batches, held.c_str()));
  reported_turns_ = true;
}

torch::Tensor TrainingStep::average_loss(torch::Tensor loss_sum, int64_t micro_batches, const torch::Tensor& loss_tokens) const {
  if (parts_.parallel.sizes.pp > 1) parts_.parallel.pp->all_reduce(loss_sum);  // only the last stage holds it
  // Context-parallel ranks hold parts of each micro-batch's loss: summed with the replicas.
  if (parts_.data_parallel.sizes.dp > 1) parts_.data_parallel.dp->all_reduce(loss_sum);
  // pretrain_gpt.py's per-token loss: summed losses over summed loss tokens.
  if (c_.training.calculate_per_token_loss) return loss_sum / loss_tokens.clamp_min(1.0);
  return loss_sum / double(micro_batches * parts_.parallel.sizes.dp);
}

torch::Tensor TrainingStep::global_token_count(torch::Tensor local) const {
  if (parts_.parallel.sizes.pp > 1) parts_.parallel.pp->all_reduce(local);  // only the last stage counts
  // Over data x context parallel: each context-parallel rank counts its own shard's tokens.
  if (parts_.data_parallel.sizes.dp > 1) parts_.data_parallel.dp->all_reduce(local);
  return local;
}

torch::Tensor TrainingStep::mtp_losses(int64_t micro_batches) {
  const int64_t depths = c_.model.mtp.num_layers;
  if (depths == 0) return {};
  // Megatron's MTP loss logging: each depth's per-micro-batch loss, over micro-batches, averaged
  // over data-parallel ranks; only the loss stage has them (summed over the pipeline group).
  // Context-parallel ranks hold parts of each micro-batch's loss: summed with the replicas.
  auto values = torch::zeros({depths}, torch::TensorOptions().device(parts_.device).dtype(torch::kFloat32));
  for (auto& chunk : parts_.chunks) {
    int64_t n = 0;
    auto sums = chunk->take_mtp_losses(&n);
    for (size_t k = 0; k < sums.size(); ++k) values[int64_t(k)] += sums[k];
  }
  if (parts_.parallel.sizes.pp > 1) parts_.parallel.pp->all_reduce(values);
  if (parts_.data_parallel.sizes.dp > 1) parts_.data_parallel.dp->all_reduce(values);
  return values / double(micro_batches * parts_.parallel.sizes.dp);
}

void TrainingStep::end_fp8_step() {
  // Megatron's amax reduction group: tensor x data parallel (x context parallel), or with
  // --tp-only-amax-red the tensor-parallel group only, so every rank of a stage shares scales.
  // Expert sites: over the ranks holding the same expert (expert tensor x expert data parallel),
  // not slot by slot over ranks that hold different experts at the same place. Dense sites: over
  // data (x context) parallel.
  const bool over_dp = parts_.data_parallel.sizes.dp > 1 && !c_.precision.fp8.tp_only_amax_reduction;
  const bool over_edp = parts_.parallel.sizes.edp > 1 && !c_.precision.fp8.tp_only_amax_reduction;
  parts_.fp8->end_step([&](torch::Tensor& amaxes) {
    torch::Tensor experts;
    if (parts_.expert_amax_slots.defined()) experts = amaxes.index_select(0, parts_.expert_amax_slots);
    if (parts_.parallel.sizes.tp > 1) parts_.parallel.tp->all_reduce(amaxes, ReduceOp::Max);
    if (over_dp) parts_.data_parallel.dp->all_reduce(amaxes, ReduceOp::Max);
    if (!experts.defined()) return;
    if (parts_.parallel.sizes.etp > 1) parts_.parallel.expert_tp->all_reduce(experts, ReduceOp::Max);
    if (over_edp) parts_.parallel.expert_dp->all_reduce(experts, ReduceOp::Max);
    amaxes.index_copy_(0, parts_.expert_amax_slots, experts);
  }, [&](torch::Tensor& attention_amaxes) {  // FP8 attention: dense layers only
    if (parts_.parallel.sizes.tp > 1) parts_.parallel.tp->all_reduce(attention_amaxes, ReduceOp::Max);
    if (over_dp) parts_.data_parallel.dp->all_reduce(attention_amaxes, ReduceOp::Max);
  });
}

// --fp8tron-test-inject-nan ITER:PARAM: NaN in the first element of PARAM's gradient, on the
// ranks holding it.
void TrainingStep::inject_nan_gradient() {
  torch::NoGradGuard no_grad;
  for (auto& chunk : parts_.chunks)
    for (const auto& item : chunk->named_parameters())
      if (item.key() == c_.training.numerics.test_nan_param && item.value().grad().defined() && item.value().numel() > 0) {
        if (item.value().grad().storage().data() == nullptr)
          throw UserError("--fp8tron-test-inject-nan: " + item.key() + "'s gradient is already reduced onto its owner "
                          "(gradients sharded per layer under --data-parallel-sharding-strategy optim_grads_params); "
                          "inject under another strategy");
        item.value().grad().view({-1})[0].fill_(std::nan(""));
      }
}

std::string TrainingStep::first_nonfinite_grad_everywhere() {
  // Each rank's first, then the first of all in pipeline order: (pipeline rank, position, name).
  std::string mine;
  if (const auto first = parts_.optimizer->first_nonfinite_grad())
    mine = strprintf("%06d %012lld %s", parts_.parallel.pp_rank, (long long)first->first, first->second.c_str());
  std::string best;
  for (const std::string& other : all_gather_strings(parts_.parallel, parts_.device, mine))
    if (!other.empty() && (best.empty() || other < best)) best = other;
  return best.empty() ? "" : best.substr(20);
}


}  // namespace fp8tron
