#include "data/dataset_builder.h"

#include <map>

#include "core/error.h"
#include "core/text.h"
#include "data/blended_dataset.h"
#include "data/fim_dataset.h"
#include "data/indexed_dataset.h"

namespace fp8tron::data {
namespace {

using Ranges = std::array<SplitRange, kNumSplits>;

class Builder {
 public:
  explicit Builder(const GptDatasetsConfig& config) : config_(config) {}

  // GptDatasets of one dataset for every split whose range is set.
  std::array<std::shared_ptr<const GptDataset>, kNumSplits> gpt_splits(
      const std::shared_ptr<const LowLevelDataset>& data, const Ranges& ranges,
      const std::array<std::optional<int64_t>, kNumSplits>& sizes) {
    std::array<std::shared_ptr<const GptDataset>, kNumSplits> out;
    for (int i = 0; i < kNumSplits; ++i) {
      if (!ranges[i]) continue;
      out[i] = std::make_shared<GptDataset>(data, sequence_range(*ranges[i], data->num_sequences()), sizes[i],
                                            Split(i), config_.gpt);
    }
    return out;
  }

  // The datasets of `blend` for the splits in `ranges`, blended per split.
  SplitDatasets blend(const Blend& blend, const Ranges& ranges, const std::array<std::optional<int64_t>, kNumSplits>& sizes) {
    if (blend.prefixes.size() == 1 && !blend.weights) {
      auto single = gpt_splits(open(blend.prefixes[0]), ranges, sizes);
      return {member(single[0]), member(single[1]), member(single[2])};
    }
    std::optional<std::vector<double>> weights;
    if (blend.weights) weights = normalize(*blend.weights);
    // Per dataset, per split: the samples to build (with the surplus margin).
    std::vector<std::array<std::shared_ptr<const GptDataset>, kNumSplits>> parts;
    for (size_t d = 0; d < blend.prefixes.size(); ++d) {
      std::array<std::optional<int64_t>, kNumSplits> buffer;
      for (int i = 0; i < kNumSplits; ++i) {
        if (!weights || !sizes[i]) continue;
        buffer[i] = samples_per_dataset({(*weights)[d]}, *sizes[i], config_.mid_level_dataset_surplus)[0];
      }
      parts.push_back(gpt_splits(open(blend.prefixes[d]), ranges, buffer));
    }
    SplitDatasets out;
    for (int i = 0; i < kNumSplits; ++i) {
      if (!ranges[i]) continue;
      std::vector<std::shared_ptr<const SampleDataset>> members;
      for (auto& p : parts) members.push_back(member(p[i]));
      out[i] = blend_split(members, weights, sizes[i], Split(i));
    }
    return out;
  }

 private:
  // A GPT dataset as a blend member or split: rewritten by --fim-data when it is given.
  std::shared_ptr<const SampleDataset> member(std::shared_ptr<const GptDataset> gpt) const {
    if (!gpt || !config_.fim) return gpt;
    return std::make_shared<FimDataset>(std::move(gpt), config_.fim->tokenizer, config_.fim->options, config_.gpt.seed);
  }

  std::shared_ptr<const SampleDataset> blend_split(const std::vector<std::shared_ptr<const SampleDataset>>& members,
                                                   const std::optional<std::vector<double>>& weights,
                                                   std::optional<int64_t> size, Split split) {
    std::vector<double> blend_weights;
    std::optional<int64_t> blend_size;
    if (weights && size) {
      // The blend draws exactly the targets (without the margin): sum of ceil(size * w).
      int64_t total = 0;
      for (int64_t n : samples_per_dataset(*weights, *size, 0.0)) total += n;
      blend_weights = *weights;
      blend_size = total;
    } else if (weights) {
      throw UserError(strprintf("the %s split has dataset weights but no sample count: weighted --data-path "
                                "blends need a known number of samples", split_name(split)));
    } else {
      int64_t total = 0;
      for (const auto& m : members) {
        blend_weights.push_back(double(m->size()));
        total += m->size();
      }
      if (size) blend_size = std::min(*size, total);
    }
    return std::make_shared<BlendedDataset>(members, blend_weights, blend_size, split, config_.gpt.cache_dir);
  }

  std::shared_ptr<const IndexedDataset> open(const std::string& prefix) {
    auto& slot = opened_[prefix];
    if (!slot) slot = std::make_shared<const IndexedDataset>(prefix);
    return slot;
  }

  const GptDatasetsConfig& config_;
  std::map<std::string, std::shared_ptr<const IndexedDataset>> opened_;
};

}  // namespace

SplitDatasets build_gpt_datasets(const GptDatasetsConfig& config) {
  Builder builder(config);
  if (config.mock) {
    if (config.fim) throw UserError("--fim-data does not work with --mock-data (as in Megatron): pass --data-path");
    // Megatron's mock data: the split is "1,1,1" whatever --split says.
    auto splits = builder.gpt_splits(config.mock, split_matrix(parse_split("1,1,1")), config.sizes);
    return {splits[0], splits[1], splits[2]};
  }
  bool per_split = false;
  for (const auto& b : config.blend_per_split) per_split = per_split || b.has_value();
  if (config.blend && per_split)
    throw UserError("--data-path cannot be combined with --train-data-path/--valid-data-path/--test-data-path");
  if (config.blend) return builder.blend(*config.blend, split_matrix(parse_split(config.split)), config.sizes);

  SplitDatasets out;
  for (int i = 0; i < kNumSplits; ++i) {
    if (!config.blend_per_split[i]) continue;
    // Each split's own data is used whole: range [0, 1) for that split only.
    Ranges ranges;
    ranges[i] = std::make_pair(0.0, 1.0);
    std::array<std::optional<int64_t>, kNumSplits> sizes{0, 0, 0};
    sizes[i] = config.sizes[i];
    out[i] = builder.blend(*config.blend_per_split[i], ranges, sizes)[i];
  }
  return out;
}

}  // namespace fp8tron::data
