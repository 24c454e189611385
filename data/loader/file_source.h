// Megatron indexed datasets (--data-path / --train-data-path ..., --split) as a SampleSource:
// one blended GPT dataset per split, sized as Megatron sizes them.
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <optional>

#include "core/config/data_config.h"
#include "data/loader/sample_source.h"

namespace fp8tron {

// What the datasets are sized and sampled by, besides the data flags: the samples each split
// must provide (train, valid, test), the sequence length and the seed of the shuffles.
struct FileSourceSizes {
  std::array<int64_t, 3> samples{};
  int64_t seq_length = 0;
  uint64_t seed = 1234;
};

// Megatron's split sizes: train = iterations x global batch (or --train-samples); valid =
// evaluation points x eval iterations x evaluation batch, with iterations / eval interval + 1
// points less the ones before --start-eval-at-iter; test = eval iterations x evaluation batch.
std::array<int64_t, 3> megatron_split_samples(int64_t train_iters, std::optional<int64_t> train_samples,
                                              int64_t global_batch_size, int64_t eval_global_batch_size,
                                              int64_t eval_interval, int64_t eval_iters,
                                              std::optional<int64_t> start_eval_at_iter = std::nullopt);

std::unique_ptr<SampleSource> make_file_source(const DataConfig& data, const FileSourceSizes& sizes);

}  // namespace fp8tron
