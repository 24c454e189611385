#include "data/loader/file_source.h"

#include <algorithm>

#include "core/error.h"
#include "core/text.h"
#include "data/data_spec.h"
#include "data/dataset_builder.h"
#include "data/fim_tokens.h"
#include "data/tokenizer.h"
#include "data/loader/split_datasets_source.h"

namespace fp8tron {
namespace {

std::optional<data::Blend> blend_of(const std::vector<std::string>& paths) {
  if (paths.empty()) return std::nullopt;
  return data::parse_blend(paths);
}

}  // namespace

std::array<int64_t, 3> megatron_split_samples(int64_t train_iters, std::optional<int64_t> train_samples,
                                              int64_t global_batch_size, int64_t eval_global_batch_size,
                                              int64_t eval_interval, int64_t eval_iters,
                                              std::optional<int64_t> start_eval_at_iter) {
  const int64_t eval_gbs = eval_global_batch_size;
  int64_t eval_points = train_iters / eval_interval + 1;
  if (start_eval_at_iter) eval_points = std::max<int64_t>(0, eval_points - *start_eval_at_iter / eval_interval);
  return {train_samples.value_or(train_iters * global_batch_size), eval_points * eval_iters * eval_gbs,
          eval_iters * eval_gbs};
}

std::unique_ptr<SampleSource> make_file_source(const DataConfig& data, const FileSourceSizes& sizes) {
  data::GptDatasetsConfig dc;
  dc.blend = blend_of(data.data_path);
  dc.blend_per_split = {blend_of(data.train_data_path), blend_of(data.valid_data_path), blend_of(data.test_data_path)};
  dc.split = data.split;
  dc.sizes = {sizes.samples[0], sizes.samples[1], sizes.samples[2]};
  dc.gpt.sequence_length = sizes.seq_length;
  dc.gpt.seed = uint32_t(sizes.seed);
  dc.gpt.cache_dir = data.data_cache_path;
  if (data.fim.enabled) {
    // The rewrite detokenizes and tokenizes again: it needs the run's tokenizer (the warnings
    // about its FIM tokens were given when the configuration was checked).
    std::shared_ptr<const data::Tokenizer> tokenizer = data::build_tokenizer(data::tokenizer_options(data));
    dc.fim = data::GptDatasetsConfig::Fim{data::fim_options(data.fim, *tokenizer, nullptr), tokenizer};
  }
  auto datasets = data::build_gpt_datasets(dc);
  if (!datasets[0]) throw UserError("the training split is empty: check --data-path/--train-data-path and --split");
  return make_split_datasets_source(std::move(datasets));
}

}  // namespace fp8tron
