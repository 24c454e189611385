// What a run reports: Megatron's start-up lines, the iteration line every --log-interval (losses
// averaged over the interval, throughput, the timers gathered over the ranks, memory once), the
// validation block, the scalars for TensorBoard and W&B (training, validation, memory, MoE, FP8
// cast statistics) and the per-iteration MoE and MTP losses a test run returns. The sums of an interval stay on the
// device, so reporting never makes the loop wait for the GPU between log lines.
#pragma once
#include <torch/torch.h>

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "trainer/logging/scalar_writers.h"
#include "trainer/logging/timers.h"
#include "trainer/run_parts.h"
#include "trainer/run_progress.h"

namespace fp8tron {

class RunReporter {
 public:
  // `wandb`: the W&B run on the last rank (start_wandb_run), else nullptr.
  RunReporter(RunParts& parts, RunProgress& progress, Timers& timers, std::unique_ptr<WandbWriter> wandb);

  // The lines Megatron prints once the model, optimizer and data are built.
  void log_start() const;
  // A step the rerun engine accepted: its loss (and each MTP depth's) into the interval's sums.
  void add_step(const torch::Tensor& loss, const torch::Tensor& mtp_losses);
  // Every iteration: the MoE losses and per-layer statistics (collective over the MoE groups).
  void report_moe(int64_t iteration);
  // Whether this iteration's training scalars are written: every --tensorboard-log-interval with
  // --tensorboard-dir or --wandb-project (the same answer on every rank).
  bool training_scalars_due(int64_t iteration) const;
  // The training scalars (TensorBoard on rank 0, W&B on the last rank; every rank joins the
  // parameter norm's collectives when --log-params-norm).
  void write_training_scalars(int64_t iteration, const torch::Tensor& loss);
  // --log-fp8-stats-to-tensorboard: whether this iteration's casts are counted, and their report
  // (collective: every rank's statistics reach the ranks that write).
  bool fp8_stats_due(int64_t iteration) const;
  void log_fp8_stats(int64_t iteration);
  // Every --log-interval (collective): the iteration line, the timers, memory after the first.
  void log_interval(int64_t iteration, double seconds, int64_t iterations_in_interval);
  void log_validation(int64_t iteration, double loss, bool at_end);
  // The end of a run that finished: TensorBoard flushed, the W&B run closed as finished. (A
  // reporter destroyed without it, by an error, closes the W&B run as failed.)
  void finish();

  // Every iteration's MoE losses and each MTP depth's loss ("mtp_1", ...), read once the run is
  // over (each read waits for the device).
  std::map<std::string, std::vector<double>> moe_history() const;
  std::map<std::string, std::vector<double>> mtp_history() const;

 private:
  void log_tp_overlap() const;
  void log_moe_layout() const;
  std::string iteration_line(int64_t iteration, double seconds, int64_t iterations_in_interval);
  void write_timers(int64_t iteration, int64_t iterations_in_interval);

  // Running sums over a log interval.
  struct IntervalSums {
    torch::Tensor loss_sum, loss_count, skipped, nan;
    torch::Tensor mtp_loss_sums;  // [D]: each MTP depth's loss summed over the interval's steps
    // MoE losses (load_balancing_loss, z_loss, ...) summed over the interval's iterations, in the
    // order they first appeared (Megatron's total_loss_dict).
    std::vector<std::pair<std::string, torch::Tensor>> moe_sums;
    void reset(const torch::Device& d, int64_t mtp_layers);
    void add_moe(const std::string& name, const torch::Tensor& value);
  };

  RunParts& parts_;
  RunProgress& progress_;
  Timers& timers_;
  ScalarWriters writers_;  // TensorBoard on rank 0, W&B on the last rank
  IntervalSums interval_;
  bool memory_reported_ = false;
  std::map<std::string, std::vector<torch::Tensor>> moe_history_;
  std::vector<torch::Tensor> mtp_history_;  // [D] per iteration
};

}  // namespace fp8tron
