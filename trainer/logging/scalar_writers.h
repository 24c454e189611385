// Where a run's scalars go: TensorBoard (--tensorboard-dir, written by rank 0) and Weights &
// Biases (--wandb-project, by the last rank, as Megatron-LM), and Megatron's rule for the names
// each receives. TensorBoard keeps the training scalars twice, against the iteration and against
// the consumed samples ("<name> vs samples"); W&B keeps one series per name, stepped by the
// iteration, plus "samples vs steps". A rank holds the writers it writes, possibly none.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "trainer/logging/tensorboard_writer.h"
#include "trainer/logging/wandb_writer.h"

namespace fp8tron {

class ScalarWriters {
 public:
  ScalarWriters(std::unique_ptr<TensorBoardWriter> tensorboard, std::unique_ptr<WandbWriter> wandb);

  bool any() const { return tensorboard_ || wandb_; }

  // To both, against the iteration.
  void add(const std::string& name, double value, int64_t iteration);
  // To both against the iteration; TensorBoard also has "<name> vs samples" against the samples.
  void add_with_samples(const std::string& name, double value, int64_t iteration, int64_t consumed_samples);
  // Megatron writes these to TensorBoard only: memory and validation perplexity.
  void add_tensorboard_only(const std::string& name, double value, int64_t step);
  // W&B's "samples vs steps": the consumed samples at each logged iteration (Megatron's stand-in
  // for the "vs samples" twins, which W&B's one step axis cannot hold).
  void add_samples_vs_steps(int64_t consumed_samples, int64_t iteration);

  void flush();
  // Closes the W&B run with the process's exit code (0: finished); waits for the logger a while.
  void finish(int exit_code);

 private:
  std::unique_ptr<TensorBoardWriter> tensorboard_;
  std::unique_ptr<WandbWriter> wandb_;
};

}  // namespace fp8tron
