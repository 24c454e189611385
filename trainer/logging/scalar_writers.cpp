#include "trainer/logging/scalar_writers.h"

#include <chrono>
#include <utility>

namespace fp8tron {

ScalarWriters::ScalarWriters(std::unique_ptr<TensorBoardWriter> tensorboard, std::unique_ptr<WandbWriter> wandb)
    : tensorboard_(std::move(tensorboard)), wandb_(std::move(wandb)) {}

void ScalarWriters::add(const std::string& name, double value, int64_t iteration) {
  if (tensorboard_) tensorboard_->add_scalar(name, value, iteration);
  if (wandb_) wandb_->log(name, value, iteration);
}

void ScalarWriters::add_with_samples(const std::string& name, double value, int64_t iteration, int64_t consumed_samples) {
  add(name, value, iteration);
  if (tensorboard_) tensorboard_->add_scalar(name + " vs samples", value, consumed_samples);
}

void ScalarWriters::add_tensorboard_only(const std::string& name, double value, int64_t step) {
  if (tensorboard_) tensorboard_->add_scalar(name, value, step);
}

void ScalarWriters::add_samples_vs_steps(int64_t consumed_samples, int64_t iteration) {
  if (wandb_) wandb_->log("samples vs steps", double(consumed_samples), iteration);
}

void ScalarWriters::flush() {
  if (tensorboard_) tensorboard_->flush();
}

void ScalarWriters::finish(int exit_code) {
  flush();
  // Offline, closing a run takes a second or two; online, W&B uploads what is left first.
  if (wandb_) wandb_->finish(exit_code, std::chrono::seconds(120));
}

}  // namespace fp8tron
