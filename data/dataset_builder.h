// BlendedMegatronDatasetBuilder for GPT: turns --data-path/--split (or per-split data paths, or
// --mock-data) and the number of samples each split needs into one dataset per split, following
// Megatron's cases:
//   mock data                    -> a GptDataset per split over the mock documents, split 1,1,1
//   one prefix, no weights       -> a GptDataset per split
//   weights and a size           -> GptDatasets of ceil(ceil(size * w) * 1.005) samples each,
//                                   blended into sum(ceil(size * w)) samples
//   no weights, a size           -> one-epoch GptDatasets blended by their lengths,
//                                   min(size, total) samples
//   no weights, no size          -> every sample of every dataset exactly once
// With --fim-data each GPT dataset is a FIM dataset (fim_dataset.h), as Megatron builds
// GPTFIMDatasets in their place.
#pragma once
#include <array>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "data/data_spec.h"
#include "data/fim_transform.h"
#include "data/gpt_dataset.h"
#include "data/low_level_dataset.h"
#include "data/sample_dataset.h"
#include "data/tokenizer.h"

namespace fp8tron::data {

struct GptDatasetsConfig {
  std::shared_ptr<const LowLevelDataset> mock;                // --mock-data (mock_dataset.h)
  std::optional<Blend> blend;                                 // --data-path
  std::array<std::optional<Blend>, kNumSplits> blend_per_split;  // --train/valid/test-data-path
  std::string split = "969, 30, 1";                           // --split (with --data-path only)
  std::array<std::optional<int64_t>, kNumSplits> sizes;       // samples each split must supply
  GptDatasetConfig gpt;
  double mid_level_dataset_surplus = 0.005;
  // --fim-data: every GPT dataset's samples rewritten for fill-in-the-middle (fim_dataset.h),
  // seeded by gpt.seed.
  struct Fim {
    FimOptions options;
    std::shared_ptr<const Tokenizer> tokenizer;
  };
  std::optional<Fim> fim;
};

using SplitDatasets = std::array<std::shared_ptr<const SampleDataset>, kNumSplits>;

// One dataset per split (nullptr where the split is empty or has no data path). Every process
// may call this at once: the cached indices are built by one of them (index_cache.h).
SplitDatasets build_gpt_datasets(const GptDatasetsConfig& config);

}  // namespace fp8tron::data
