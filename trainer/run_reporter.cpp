#include "trainer/run_reporter.h"

#include <c10/cuda/CUDACachingAllocator.h>
#include <sys/resource.h>

#include <array>
#include <cmath>
#include <sstream>

#include "checkpoint/rank_agreement.h"
#include "core/log.h"
#include "core/text.h"
#include "fp8/packed_rows.h"
#include "models/linear/grouped_linear.h"
#include "trainer/cli/model_math.h"
#include "trainer/cli/tp_overlap_args.h"
#include "trainer/logging/iteration_log.h"
#include "trainer/moe_metrics.h"

namespace fp8tron {
namespace {

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

std::unique_ptr<TensorBoardWriter> tensorboard_writer(const Config& c) {
  if (c.logging.tensorboard_dir.empty() || log::rank() != 0) return nullptr;
  return std::make_unique<TensorBoardWriter>(c.logging.tensorboard_dir);
}

}  // namespace

void RunReporter::IntervalSums::reset(const torch::Device& d, int64_t mtp_layers) {
  auto z = torch::zeros({}, torch::TensorOptions().device(d).dtype(torch::kFloat32));
  loss_sum = z.clone();
  loss_count = z.clone();
  skipped = z.clone();
  nan = z.clone();
  mtp_loss_sums = torch::zeros({mtp_layers}, z.options());
  for (auto& [name, sum] : moe_sums) sum = z.clone();
}

void RunReporter::IntervalSums::add_moe(const std::string& name, const torch::Tensor& value) {
  for (auto& [n, sum] : moe_sums)
    if (n == name) {
      sum = sum + value;
      return;
    }
  moe_sums.emplace_back(name, value.clone());
}

RunReporter::RunReporter(RunParts& parts, RunProgress& progress, Timers& timers, std::unique_ptr<WandbWriter> wandb)
    : parts_(parts), progress_(progress), timers_(timers), writers_(tensorboard_writer(parts.config), std::move(wandb)) {
  interval_.reset(parts.device, parts.config.model.mtp.num_layers);
}

void RunReporter::log_start() const {
  const Config& c = parts_.config;
  const torch::Device& device = parts_.device;
  if (c.training.eval_iters > 0 && !parts_.valid_loader->has_data()) log::info(" > no validation data: evaluation is skipped");
  log::print(strprintf(" > number of parameters on (tensor, pipeline) model parallel rank (%d, %d): %lld",
                       parts_.parallel.tp_rank, parts_.parallel.pp_rank, (long long)parts_.optimizer->num_parameters()));
  const std::string backend = attention_backend_name(c.model, c.training.micro_batch_size, device, param_dtype(c));
  if (device.is_cuda() && c.training.deterministic) {
    log::info(" > attention: " + backend + " with its deterministic backward (--deterministic-mode)");
  } else {
    log::info(" > attention: " + backend);
    if (device.is_cuda() && backend != "cuDNN fused attention")
      log::warning("cuDNN attention is not available for these shapes/settings; using " + backend);
  }
  if (parts_.fp8) log::info(" > " + parts_.fp8->describe());
  if (parts_.step_graph)
    log::info(strprintf(" > CUDA graph: each step's forward and backward passes run as one graph, captured after %lld "
                        "eager steps (--cuda-graph-impl full_iteration)",
                        (long long)c.training.cuda_graph.warmup_steps));
  log_tp_overlap();
  if (parts_.moe) log_moe_layout();
  const auto& t = c.training;
  if (t.rampup) {
    // Megatron's messages (sic: no space in "batchsize").
    log::info(strprintf("will use batch size rampup starting from global batch size %lld to global batch size %lld with "
                        "batchsize increments %lld over %lld samples.",
                        (long long)t.rampup->start, (long long)t.global_batch_size, (long long)t.rampup->increment,
                        (long long)t.rampup->samples));
  }
  if (!t.step_batch_schedule.empty()) {  // Megatron's StepBatchsizeNumMicroBatchesCalculator messages
    const int64_t micro_dp = t.micro_batch_size * parts_.parallel.sizes.dp;
    log::info("> initializing step batch size schedule");
    log::info(strprintf("  seq_length: %lld (thresholds interpreted as tokens)", (long long)c.model.seq_length));
    log::info(strprintf("step batch size schedule (%zu steps):", t.step_batch_schedule.size()));
    for (const auto& [threshold, batch] : t.step_batch_schedule)
      log::info(strprintf("  >= %lld tokens (%lld samples) -> batch_size=%lld, num_microbatches=%lld",
                          (long long)(threshold * c.model.seq_length), (long long)threshold, (long long)batch,
                          (long long)(batch / micro_dp)));
  }
  if (t.train_samples) log::print(strprintf("setting training iterations to %lld", (long long)t.train_iters));
  if (!parts_.iterations_to_skip.empty()) {
    std::vector<std::string> skipped;
    for (int64_t i : parts_.iterations_to_skip) skipped.push_back(std::to_string(i));
    log::info(" > iterations to skip (--iterations-to-skip, --result-rejected-tracker-filename): " + join(skipped, ", "));
  }
}

// The resolved overlap plan and how it maps onto this machine, once.
void RunReporter::log_tp_overlap() const {
  const auto& plan = parts_.config.distributed.tp_overlap;
  if (!plan.enabled()) return;
  log::info(" > " + plan.describe());
  const std::string ascend = ascend_mapping_notice(plan);
  if (!ascend.empty()) log::info(" > " + ascend);
  if (parts_.device.is_cuda()) {
    log::info(" > tensor-parallel overlap transport: NCCL point-to-point and collectives on the group's own stream; "
              "NVLink multicast is not used");
    if (!parts_.fp8)
      log::info(" > the overlapped linears' bf16 GEMMs run through ATen (cuBLAS) without an SM budget: "
                "set_sm_margin applies to FP8 GEMMs");
  }
}

void RunReporter::log_moe_layout() const {
  const auto& m = parts_.config.model.moe;
  const ParallelSizes& z = parts_.parallel.sizes;
  log::info(strprintf(" > mixture of experts: %lld of %lld layers, %lld experts (%lld per expert-parallel rank), top-%lld, "
                      "%s dispatcher; experts' gradients reduced over the expert data-parallel group (%d ranks)",
                      (long long)m.num_moe_layers(), (long long)parts_.config.model.num_layers, (long long)m.num_experts,
                      (long long)(m.num_experts / z.ep), (long long)m.topk,
                      m.dispatcher == MoeDispatcher::kAllToAll ? "alltoall" : "allgather", z.edp));
  if (parts_.fp8 && m.expert_gemm_fp8)
    log::info(" > FP8 experts: each expert's amaxes are reduced over the ranks holding that expert (expert tensor x "
              "expert data parallel), so an expert's scales do not depend on the expert-parallel layout");
  if (m.dispatch_fp8 && parts_.fp8) {
    // The MoE layers of this rank whose dispatch sends FP8 rows (their experts' fc1 runs in FP8).
    int64_t fp8_layers = 0, layers = 0;
    for (const auto& chunk : parts_.chunks)
      for (const auto& module : chunk->modules())
        if (const auto* g = dynamic_cast<const TEGroupedLinearImpl*>(module.get());
            g && g->options.parallel_mode == GroupedParallelMode::kColumn) {
          ++layers;
          fp8_layers += g->input_dispatched_fp8 ? 1 : 0;
        }
    const int64_t h = parts_.config.model.hidden_size;
    const auto row = fp8::packed_row_layout(parts_.fp8->recipe(), h);
    log::info(strprintf(" > --moe-dispatch-fp8: %lld of this rank's %lld MoE layers send each token once quantized "
                        "(%s, %lld codes + %lld scales = %lld bytes, against %lld in bf16); the combine and the "
                        "gradients travel in the activations' dtype%s",
                        (long long)fp8_layers, (long long)layers, fp8::recipe_kind_name(fp8::recipe_kind(parts_.fp8->recipe())),
                        (long long)h, (long long)row.scales, (long long)row.row_bytes(), (long long)(2 * h),
                        fp8_layers < layers ? " (the others' experts stay bf16: they dispatch bf16)" : ""));
  }
}

void RunReporter::add_step(const torch::Tensor& loss, const torch::Tensor& mtp_losses) {
  // Megatron's counters: "skipped" = the update was not applied; "nan" = the loss was not finite.
  // Without a dynamic loss scale (bf16, fp32) a non-finite gradient is a nan iteration as well.
  const StepResult& step = progress_.last_step;
  auto loss_ok = loss.isfinite().to(torch::kFloat32);
  auto applied = 1.0 - step.found_inf;
  interval_.loss_sum += torch::where(loss.isfinite(), loss, torch::zeros_like(loss)) * applied;
  interval_.loss_count += loss_ok * applied;
  interval_.skipped += step.found_inf;
  interval_.nan += progress_.scaler.dynamic() ? 1.0 - loss_ok : torch::maximum(1.0 - loss_ok, step.found_inf);
  if (mtp_losses.defined()) {
    interval_.mtp_loss_sums += mtp_losses;
    mtp_history_.push_back(mtp_losses);
  }
}

void RunReporter::report_moe(int64_t iteration) {
  // This step's micro-batch count (a batch-size ramp-up changes it), as Megatron's get_num_microbatches().
  const MoeMetricsReport r = report_moe_metrics(*parts_.moe, parts_.parallel, progress_.micro_batches, parts_.device,
                                                logged_moe_layers(parts_.config.model));
  for (const auto& [name, value] : r.scalars) {
    interval_.add_moe(name, value);
    moe_history_[name].push_back(value);
  }
  if (!writers_.any()) return;
  // Every iteration, as Megatron's training_log (not gated by --tensorboard-log-interval).
  for (const auto& [name, value] : r.scalars) writers_.add(name, value.item<double>(), iteration);
  if (!parts_.config.model.moe.per_layer_logging) return;
  for (const auto& [name, values] : r.per_layer) {
    auto host = values.cpu();
    for (int64_t i = 0; i < host.numel(); ++i)
      writers_.add("moe/" + name + "_layer_" + std::to_string(i), host[i].item<double>(), iteration);
  }
}

std::string RunReporter::iteration_line(int64_t iteration, double seconds, int64_t iterations_in_interval) {
  const Config& c = parts_.config;
  const auto& t = c.training;
  IterationStats s;
  s.iteration = iteration;
  s.train_iters = t.train_iters;
  s.consumed_samples = progress_.consumed_train_samples;
  s.skipped_samples = progress_.skipped_train_samples;
  s.elapsed_ms_per_iteration = seconds * 1000.0 / double(iterations_in_interval);
  const double tokens_per_iteration =
      double(progress_.micro_batches * t.micro_batch_size * parts_.parallel.sizes.dp * c.model.seq_length);
  const double per_iteration_s = seconds / double(iterations_in_interval);
  if (c.logging.log_throughput)
    s.tflops_per_gpu = training_flops_per_token(c.model) * tokens_per_iteration / per_iteration_s /
                       double(c.parallel.world_size) / 1e12;
  s.tokens_per_second = tokens_per_iteration / per_iteration_s;
  s.learning_rate = progress_.schedule.lr();
  s.global_batch_size = progress_.current_global_batch;
  const double count = interval_.loss_count.item<double>();
  s.lm_loss = count > 0 ? interval_.loss_sum.item<double>() / count : std::nan("");
  for (int64_t k = 0; k < c.model.mtp.num_layers; ++k)
    s.mtp_losses.push_back(interval_.mtp_loss_sums[k].item<double>() / double(iterations_in_interval));
  // Megatron divides the MoE losses by the advanced (not skipped) iterations of the interval.
  const double advanced = std::max(1.0, double(iterations_in_interval) - interval_.skipped.item<double>());
  for (const auto& [name, sum] : interval_.moe_sums) s.moe_losses.emplace_back(name, sum.item<double>() / advanced);
  s.loss_scale = progress_.scaler.scale();
  s.grad_norm = progress_.last_step.grad_norm.item<double>();
  if (progress_.last_step.num_zeros.defined()) s.num_zeros = progress_.last_step.num_zeros.item<int64_t>();
  if (c.logging.log_params_norm) s.params_norm = parts_.optimizer->params_norm().item<double>();
  s.skipped_iterations = int64_t(interval_.skipped.item<double>());
  s.nan_iterations = int64_t(interval_.nan.item<double>());
  if (s.tflops_per_gpu) writers_.add("throughput", *s.tflops_per_gpu, iteration);
  return format_iteration_line(s);
}

// The timers' report, in Megatron's log order, with every rank's times gathered over the world.
void RunReporter::write_timers(int64_t iteration, int64_t iterations_in_interval) {
  // tp-comm-exposed / pp-comm-exposed / ep-comm-exposed / dp-comm-exposed: the waits for
  // tensor-parallel collectives, pipeline receives, expert-parallel all-to-alls and data-parallel
  // gradient reductions and parameter gathers that no computation hid (parallel/overlap/comm_timer.h).
  static const std::vector<std::string> kLogOrder = {"forward-backward", "batch-generator", "moe-token-dispatch",
                                                     "moe-token-combine", "optimizer", "tp-comm-exposed",
                                                     "pp-comm-exposed", "ep-comm-exposed", "dp-comm-exposed",
                                                     "delayed-wgrad-compute"};
  const ParallelState& p = parts_.parallel;
  auto gather = [&](const std::vector<double>& mine) {
    const int n = p.sizes.world_size;
    auto local = torch::tensor(mine, torch::TensorOptions().dtype(torch::kFloat64)).to(parts_.device);
    auto all = torch::empty({n * int64_t(mine.size())}, local.options());
    p.world->all_gather(all, local);
    all = all.cpu();
    return std::vector<double>(all.data_ptr<double>(), all.data_ptr<double>() + all.numel());
  };
  const Timers::Report timing = timers_.report(kLogOrder, double(iterations_in_interval),
                                               parts_.config.logging.timing_log_option, gather, p.sizes.world_size);
  if (!timing.text.empty()) log::print(timing.text);
  if (parts_.config.logging.log_timers_to_tensorboard)
    for (const auto& [name, ms] : timing.max_ms) writers_.add(name + "-time", ms, iteration);
  // The MoE dispatch all-to-all's bytes per iteration (with EP > 1 and the alltoall dispatcher):
  // what --moe-dispatch-fp8 halves; the bytes fine-grained activation offloading copied to host
  // memory. Every rank takes part (a collective), at timing level 1 or more.
  std::vector<std::string> counters;
  if (parts_.moe) counters.push_back("moe-dispatch-all-to-all");
  if (parts_.config.model.offload.enabled) counters.push_back("activation-offload");
  if (counters.empty() || !timers_.enabled(1)) return;
  const Timers::Report bytes = timers_.report_counts(counters, double(iterations_in_interval),
                                                     parts_.config.logging.timing_log_option, gather, p.sizes.world_size);
  if (!bytes.text.empty()) log::print(bytes.text);
  if (parts_.config.logging.log_timers_to_tensorboard)
    for (const auto& [name, value] : bytes.max_ms) writers_.add(name + "-bytes", value, iteration);
}

void RunReporter::log_interval(int64_t iteration, double seconds, int64_t iterations_in_interval) {
  // Megatron prints this line with print_rank_last, not through logging: --logging-level never hides it.
  log::print(iteration_line(iteration, seconds, iterations_in_interval));
  interval_.reset(parts_.device, parts_.config.model.mtp.num_layers);
  // Megatron's "iteration-time": seconds per iteration over the interval.
  if (parts_.config.logging.log_timers_to_tensorboard)
    writers_.add("iteration-time", seconds / double(iterations_in_interval), iteration);
  write_timers(iteration, iterations_in_interval);
  if (!memory_reported_) {
    log::print(memory_report(parts_.device, iteration));
    memory_reported_ = true;
  }
}

bool RunReporter::training_scalars_due(int64_t iteration) const {
  const auto& g = parts_.config.logging;
  return (!g.tensorboard_dir.empty() || g.wandb.enabled()) && iteration % g.tensorboard_log_interval == 0;
}

void RunReporter::write_training_scalars(int64_t iteration, const torch::Tensor& loss) {
  const Config& c = parts_.config;
  if (!writers_.any() && !c.logging.log_params_norm) return;  // nothing to write, no norm to join
  const double l = loss.item<double>();
  const double params_norm = c.logging.log_params_norm ? parts_.optimizer->params_norm().item<double>() : 0.0;
  if (!writers_.any()) return;  // every rank joins the norm's collectives; the writers' ranks write
  // Megatron's training_log scalars, in its order.
  const auto& g = c.logging;
  const StepResult& step = progress_.last_step;
  const int64_t samples = progress_.consumed_train_samples;
  writers_.add_samples_vs_steps(samples, iteration);
  writers_.add_with_samples("learning-rate", progress_.schedule.lr(), iteration, samples);
  if (progress_.skipped_train_samples > 0)
    writers_.add("skipped-train-samples", double(progress_.skipped_train_samples), iteration);
  writers_.add_with_samples("batch-size", double(progress_.current_global_batch), iteration, samples);
  writers_.add_with_samples("lm loss", l, iteration, samples);
  if (g.log_loss_scale_to_tensorboard) writers_.add_with_samples("loss-scale", progress_.scaler.scale(), iteration, samples);
  if (g.log_world_size_to_tensorboard) writers_.add_with_samples("world-size", double(c.parallel.world_size), iteration, samples);
  writers_.add_with_samples("grad-norm", step.grad_norm.item<double>(), iteration, samples);
  if (step.num_zeros.defined()) writers_.add_with_samples("num-zeros", double(step.num_zeros.item<int64_t>()), iteration, samples);
  if (g.log_params_norm) writers_.add_with_samples("params-norm", params_norm, iteration, samples);
  if (g.log_memory_to_tensorboard && parts_.device.is_cuda()) {
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(parts_.device.index());
    const auto all = size_t(c10::CachingAllocator::StatType::AGGREGATE);
    writers_.add_tensorboard_only("mem-reserved-bytes", double(stats.reserved_bytes[all].current), iteration);
    writers_.add_tensorboard_only("mem-allocated-bytes", double(stats.allocated_bytes[all].current), iteration);
    writers_.add_tensorboard_only("mem-max-allocated-bytes", double(stats.allocated_bytes[all].peak), iteration);
    writers_.add_tensorboard_only("mem-allocated-count", double(stats.allocation[all].current), iteration);
  }
}

// --log-fp8-stats-to-tensorboard: statistics are gathered in the steps TensorBoard logs.
bool RunReporter::fp8_stats_due(int64_t iteration) const {
  const auto& g = parts_.config.logging;
  return parts_.fp8 && g.log_fp8_stats_to_tensorboard && (!g.tensorboard_dir.empty() || g.wandb.enabled()) &&
         iteration % g.tensorboard_log_interval == 0;
}

// Every rank's FP8 cast statistics of this step to the writers (rank 0's TensorBoard, the last
// rank's W&B): a layer's tensor-parallel shards and data-parallel replicas add up (their amaxes:
// the maximum).
void RunReporter::log_fp8_stats(int64_t iteration) {
  std::string mine;
  for (const auto& s : parts_.fp8->take_stats())
    mine += strprintf("%s %s %.17g %.17g %.17g %.17g\n", s.site.c_str(), fp8::tensor_role_name(s.role), s.amax,
                      s.underflows, s.overflows, s.elements);
  const std::vector<std::string> all = all_gather_strings(parts_.parallel, parts_.device, mine);
  if (!writers_.any()) return;
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
    writers_.add("fp8/" + key + "/amax", v[0], iteration);
    writers_.add("fp8/" + key + "/underflows", v[1], iteration);
    writers_.add("fp8/" + key + "/overflows", v[2], iteration);
    writers_.add("fp8/" + key + "/elements", v[3], iteration);
  }
}

void RunReporter::log_validation(int64_t iteration, double loss, bool at_end) {
  log::print(format_validation_block(at_end ? std::string("validation loss at the end of training for val data")
                                            : strprintf("validation loss at iteration %lld", (long long)iteration),
                                     loss));
  if (!writers_.any() || at_end) return;
  const int64_t samples = progress_.consumed_train_samples;
  writers_.add_with_samples("lm loss validation", loss, iteration, samples);
  if (parts_.config.logging.log_validation_ppl_to_tensorboard) {
    const double ppl = std::exp(std::min(20.0, loss));
    writers_.add_tensorboard_only("lm loss validation ppl", ppl, iteration);
    writers_.add_tensorboard_only("lm loss validation ppl vs samples", ppl, samples);
  }
}

void RunReporter::finish() { writers_.finish(0); }

std::map<std::string, std::vector<double>> RunReporter::moe_history() const {
  std::map<std::string, std::vector<double>> out;
  for (const auto& [name, values] : moe_history_)
    for (const auto& v : values) out[name].push_back(v.item<double>());
  return out;
}

std::map<std::string, std::vector<double>> RunReporter::mtp_history() const {
  std::map<std::string, std::vector<double>> out;
  for (const auto& values : mtp_history_) {
    const auto host = values.cpu();
    for (int64_t k = 0; k < host.numel(); ++k) out["mtp_" + std::to_string(k + 1)].push_back(host[k].item<double>());
  }
  return out;
}

}  // namespace fp8tron
