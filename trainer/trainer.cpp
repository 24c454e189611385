#include "trainer/trainer.h"

#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <sys/resource.h>

#include <chrono>
#include <memory>

#include "core/error.h"
#include "core/log.h"
#include "core/text.h"
#include "data/builtin_datasets.h"
#include "models/gpt_model.h"
#include "trainer/iteration_log.h"
#include "trainer/loss_scaler.h"
#include "trainer/lr_schedule.h"
#include "trainer/mixed_precision_optimizer.h"
#include "trainer/model_math.h"
#include "trainer/tensorboard_writer.h"
#include "trainer/timers.h"

namespace fp8tron {

bool cuda_available() { return torch::cuda::is_available(); }

namespace {

using Clock = std::chrono::steady_clock;

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
    case DataSource::Mock: return make_mock_source(c.model.seq_length, c.model.vocab_size, c.training.seed);
    case DataSource::Builtin: return make_builtin_source(c.model.seq_length, c.model.vocab_size, c.training.seed);
    case DataSource::Files: break;
  }
  throw UserError("not supported yet: --data-path (data pipeline, issue 3)");
}

// Running sums over a log interval, kept on the device so the loop never waits for the GPU.
struct IntervalStats {
  torch::Tensor loss_sum, loss_count, skipped, nan;
  void reset(const torch::Device& d) {
    auto z = torch::zeros({}, torch::TensorOptions().device(d).dtype(torch::kFloat32));
    loss_sum = z.clone(); loss_count = z.clone(); skipped = z.clone(); nan = z.clone();
  }
};

class Trainer {
 public:
  explicit Trainer(const Config& c)
      : c_(c),
        device_(c.device == "cuda" ? torch::Device(torch::kCUDA, c.launch.local_rank % std::max(1, int(torch::cuda::device_count())))
                                   : torch::Device(torch::kCPU)),
        schedule_(c.lr_schedule),
        scaler_(c.precision),
        timers_(c.logging.timing_log_level, [this] { synchronize(); }) {}

  TrainResult run();

 private:
  void synchronize() const { if (device_.is_cuda()) torch::cuda::synchronize(device_.index()); }
  void build();
  torch::Tensor train_step();
  double evaluate();
  void log_interval(int64_t iteration, double seconds, int64_t iterations_in_interval);
  void write_tensorboard(int64_t iteration, const torch::Tensor& loss);

  const Config& c_;
  torch::Device device_;
  GptModel model_{nullptr};
  std::unique_ptr<MixedPrecisionOptimizer> optimizer_;
  LrSchedule schedule_;
  LossScaler scaler_;
  Timers timers_;
  std::unique_ptr<BatchLoader> train_loader_, valid_loader_;
  std::unique_ptr<TensorBoardWriter> tensorboard_;
  IntervalStats interval_;
  StepResult last_step_;
  int64_t consumed_train_samples_ = 0, consumed_valid_samples_ = 0;
  int64_t total_skipped_ = 0, total_nan_ = 0;
};

void Trainer::build() {
  if (device_.is_cuda()) {
    c10::cuda::set_device(device_.index());
    configure_attention_backends();
  }
  torch::manual_seed(c_.training.seed);
  // Weights are drawn on the CPU in fp32 from the seed, so a given seed starts CPU and GPU runs
  // from the same weights; then they move to the device and the optimizer casts them.
  model_ = GptModel(c_.model);
  model_->to(device_);
  std::vector<std::pair<std::string, torch::Tensor>> named;
  for (const auto& item : model_->named_parameters()) named.emplace_back(item.key(), item.value());
  optimizer_ = std::make_unique<MixedPrecisionOptimizer>(named, c_.optimizer, c_.precision);
  model_->train();

  auto source = make_source(c_);
  train_loader_ = std::make_unique<BatchLoader>(source, Split::Train, c_.model.seq_length, c_.training.micro_batch_size, device_);
  valid_loader_ = std::make_unique<BatchLoader>(source, Split::Valid, c_.model.seq_length, c_.training.micro_batch_size, device_);
  if (!c_.logging.tensorboard_dir.empty() && log::rank() == 0)
    tensorboard_ = std::make_unique<TensorBoardWriter>(c_.logging.tensorboard_dir);

  log::info(strprintf(" > number of parameters on (tensor, pipeline) model parallel rank (0, 0): %lld",
                      (long long)optimizer_->num_parameters()));
  const auto dtype = c_.precision.params_dtype == ParamDtype::Bf16 ? torch::kBFloat16
                     : c_.precision.params_dtype == ParamDtype::Fp16 ? torch::kFloat16 : torch::kFloat32;
  const std::string backend = attention_backend_name(c_.model, c_.training.micro_batch_size, device_, dtype);
  log::info(" > attention: " + backend);
  if (device_.is_cuda() && backend != "cuDNN fused attention")
    log::warning("cuDNN attention is not available for these shapes/settings; using " + backend);
  interval_.reset(device_);
}

torch::Tensor Trainer::train_step() {
  const auto& t = c_.training;
  timers_.start("forward-backward", 1);
  optimizer_->zero_grad();
  auto loss_sum = torch::zeros({}, torch::TensorOptions().device(device_).dtype(torch::kFloat32));
  const double backward_scale = scaler_.scale() / double(t.num_micro_batches);
  for (int64_t mb = 0; mb < t.num_micro_batches; ++mb) {
    timers_.start("batch-generator", 2);
    Batch batch = train_loader_->load(consumed_train_samples_ + mb * t.micro_batch_size);
    timers_.stop("batch-generator", 2);
    auto loss = model_->loss(batch.tokens, batch.labels, batch.loss_mask);
    (loss * backward_scale).backward();
    loss_sum += loss.detach();
  }
  timers_.stop("forward-backward", 1);

  timers_.start("optimizer", 1);
  last_step_ = optimizer_->step(schedule_.lr(), schedule_.weight_decay(), scaler_.scale());
  timers_.stop("optimizer", 1);
  bool advance_schedule = true;
  if (scaler_.dynamic()) {
    // fp16: the scaler needs the overflow flag now (Megatron waits here too).
    const bool found_inf = last_step_.found_inf.item<float>() > 0;
    scaler_.update(found_inf);
    advance_schedule = !found_inf;
  }
  if (advance_schedule) schedule_.step(t.global_batch_size);
  consumed_train_samples_ += t.global_batch_size;

  // Megatron's counters: "skipped" = the update was not applied; "nan" = the loss was not finite.
  // Without a dynamic loss scale (bf16, fp32) a non-finite gradient is a nan iteration as well.
  auto loss = loss_sum / double(t.num_micro_batches);
  auto loss_ok = loss.isfinite().to(torch::kFloat32);
  auto applied = 1.0 - last_step_.found_inf;
  interval_.loss_sum += torch::where(loss.isfinite(), loss, torch::zeros_like(loss)) * applied;
  interval_.loss_count += loss_ok * applied;
  interval_.skipped += last_step_.found_inf;
  interval_.nan += scaler_.dynamic() ? 1.0 - loss_ok : torch::maximum(1.0 - loss_ok, last_step_.found_inf);
  return loss;
}

double Trainer::evaluate() {
  torch::NoGradGuard no_grad;
  model_->eval();
  auto total = torch::zeros({}, torch::TensorOptions().device(device_).dtype(torch::kFloat32));
  const auto& t = c_.training;
  for (int64_t i = 0; i < t.eval_iters; ++i)
    for (int64_t mb = 0; mb < t.num_micro_batches; ++mb) {
      Batch batch = valid_loader_->load(consumed_valid_samples_);
      consumed_valid_samples_ += t.micro_batch_size;
      total += model_->loss(batch.tokens, batch.labels, batch.loss_mask);
    }
  model_->train();
  return total.item<double>() / double(std::max<int64_t>(1, t.eval_iters * t.num_micro_batches));
}

void Trainer::log_interval(int64_t iteration, double seconds, int64_t iterations_in_interval) {
  const auto& t = c_.training;
  IterationStats s;
  s.iteration = iteration;
  s.train_iters = t.train_iters;
  s.consumed_samples = consumed_train_samples_;
  s.elapsed_ms_per_iteration = seconds * 1000.0 / double(iterations_in_interval);
  const double tokens_per_iteration = double(t.global_batch_size * c_.model.seq_length);
  const double per_iteration_s = seconds / double(iterations_in_interval);
  if (c_.logging.log_throughput)
    s.tflops_per_gpu = training_flops_per_token(c_.model) * tokens_per_iteration / per_iteration_s /
                       double(c_.parallel.world_size) / 1e12;
  s.tokens_per_second = tokens_per_iteration / per_iteration_s;
  s.learning_rate = schedule_.lr();
  s.global_batch_size = t.global_batch_size;
  const double count = interval_.loss_count.item<double>();
  s.lm_loss = count > 0 ? interval_.loss_sum.item<double>() / count : std::nan("");
  s.loss_scale = scaler_.scale();
  s.grad_norm = last_step_.grad_norm.item<double>();
  if (c_.logging.log_params_norm) s.params_norm = optimizer_->params_norm().item<double>();
  s.skipped_iterations = int64_t(interval_.skipped.item<double>());
  s.nan_iterations = int64_t(interval_.nan.item<double>());
  total_skipped_ += s.skipped_iterations;
  total_nan_ += s.nan_iterations;
  log::info(format_iteration_line(s));
  if (tensorboard_ && c_.logging.log_throughput && s.tflops_per_gpu) tensorboard_->add_scalar("throughput", *s.tflops_per_gpu, iteration);
  interval_.reset(device_);
}

void Trainer::write_tensorboard(int64_t iteration, const torch::Tensor& loss) {
  const double l = loss.item<double>();
  tensorboard_->add_scalar("learning-rate", schedule_.lr(), iteration);
  tensorboard_->add_scalar("learning-rate vs samples", schedule_.lr(), consumed_train_samples_);
  tensorboard_->add_scalar("batch-size", double(c_.training.global_batch_size), iteration);
  tensorboard_->add_scalar("lm loss", l, iteration);
  tensorboard_->add_scalar("lm loss vs samples", l, consumed_train_samples_);
  tensorboard_->add_scalar("loss-scale", scaler_.scale(), iteration);
  tensorboard_->add_scalar("grad-norm", last_step_.grad_norm.item<double>(), iteration);
  if (c_.logging.log_params_norm) tensorboard_->add_scalar("params-norm", optimizer_->params_norm().item<double>(), iteration);
}

TrainResult Trainer::run() {
  build();
  const auto& t = c_.training;
  TrainResult result;
  std::vector<torch::Tensor> losses;
  losses.reserve(size_t(t.train_iters));
  log::info("training ...");
  const auto start = Clock::now();
  auto interval_start = start;
  int64_t interval_iterations = 0;
  bool memory_reported = false;
  for (int64_t iteration = 1; iteration <= t.train_iters; ++iteration) {
    losses.push_back(train_step());
    ++interval_iterations;
    result.iterations = iteration;
    if (tensorboard_ && iteration % c_.logging.tensorboard_log_interval == 0) write_tensorboard(iteration, losses.back());
    if (iteration % c_.logging.log_interval == 0) {
      synchronize();
      const auto now = Clock::now();
      log_interval(iteration, std::chrono::duration<double>(now - interval_start).count(), interval_iterations);
      std::string timing = timers_.report(double(interval_iterations));
      if (!timing.empty()) log::info(timing);
      if (!memory_reported) { log::info(memory_report(device_, iteration)); memory_reported = true; }
      interval_start = Clock::now();
      interval_iterations = 0;
    }
    if (t.eval_iters > 0 && iteration % t.eval_interval == 0) {
      const auto eval_start = Clock::now();
      result.last_validation_loss = evaluate();
      log::info(format_validation_block(strprintf("validation loss at iteration %lld", (long long)iteration),
                                        result.last_validation_loss));
      if (tensorboard_) {
        tensorboard_->add_scalar("lm loss validation", result.last_validation_loss, iteration);
        tensorboard_->add_scalar("lm loss validation ppl", std::exp(std::min(20.0, result.last_validation_loss)), iteration);
      }
      interval_start += Clock::now() - eval_start;  // evaluation time is not training time
    }
    if (t.exit_interval && iteration % *t.exit_interval == 0) {
      log::info(strprintf("exiting program at iteration %lld", (long long)iteration));
      break;
    }
    if (t.exit_duration_in_mins &&
        std::chrono::duration<double>(Clock::now() - start).count() / 60.0 > double(*t.exit_duration_in_mins)) {
      log::info(strprintf("exiting program after %lld minutes", (long long)*t.exit_duration_in_mins));
      break;
    }
  }
  if (t.eval_iters > 0 && result.iterations % t.eval_interval != 0) {
    result.last_validation_loss = evaluate();
    log::info(format_validation_block("validation loss at the end of training for val data", result.last_validation_loss));
  }
  synchronize();
  for (const auto& l : losses) result.losses.push_back(l.item<double>());
  result.consumed_samples = consumed_train_samples_;
  for (const auto& item : model_->named_parameters()) {
    auto flat = item.value().detach().reshape({-1}).to(torch::kCPU, torch::kFloat64);
    result.final_weights_sample.push_back(flat[0].item<double>());
    result.final_weights_sample.push_back(flat.sum().item<double>());
  }
  if (tensorboard_) tensorboard_->flush();
  return result;
}

}  // namespace

TrainResult train(const Config& config) {
  if (!config.not_supported_yet.empty())
    throw UserError("not supported yet: " + config.not_supported_yet.front() +
                    (config.not_supported_yet.size() > 1 ? strprintf(" (and %zu more; --dry-run lists them)",
                                                                     config.not_supported_yet.size() - 1)
                                                         : ""));
  Trainer trainer(config);
  return trainer.run();
}

}  // namespace fp8tron
