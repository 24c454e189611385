#include "data/file_source.h"

#include "core/error.h"
#include "core/text.h"
#include "data/data_spec.h"
#include "data/dataset_builder.h"

namespace fp8tron {
namespace {

class FileSource : public SampleSource {
 public:
  explicit FileSource(data::SplitDatasets datasets) : datasets_(std::move(datasets)) {}
  void sample(Split split, int64_t index, int64_t* out) const override {
    const auto& d = datasets_[size_t(split)];
    FP8TRON_CHECK(d != nullptr, "sampling from an empty split");
    if (index >= d->size())
      throw UserError(strprintf("the %s split has %lld samples; sample %lld was requested (more iterations than the "
                                "dataset was built for)",
                                split == Split::Train ? "train" : split == Split::Valid ? "validation" : "test",
                                (long long)d->size(), (long long)index));
    d->sample(index, out);
  }
  bool has(Split split) const override { return datasets_[size_t(split)] != nullptr; }

 private:
  data::SplitDatasets datasets_;
};

std::optional<data::Blend> blend_of(const std::vector<std::string>& paths) {
  if (paths.empty()) return std::nullopt;
  return data::parse_blend(paths);
}

}  // namespace

std::unique_ptr<SampleSource> make_file_source(const Config& c) {
  const auto& t = c.training;
  data::GptDatasetsConfig dc;
  dc.blend = blend_of(c.data.data_path);
  dc.blend_per_split = {blend_of(c.data.train_data_path), blend_of(c.data.valid_data_path), blend_of(c.data.test_data_path)};
  dc.split = c.data.split;
  // Megatron's sizes: train = iterations x global batch; valid = (iterations / eval interval + 1)
  // x eval iterations x global batch; test = eval iterations x global batch.
  const int64_t gbs = t.global_batch_size;
  dc.sizes = {t.train_samples.value_or(t.train_iters * gbs), (t.train_iters / t.eval_interval + 1) * t.eval_iters * gbs,
              t.eval_iters * gbs};
  dc.gpt.sequence_length = c.model.seq_length;
  dc.gpt.seed = uint32_t(t.seed);
  dc.gpt.cache_dir = c.data.data_cache_path;
  auto datasets = data::build_gpt_datasets(dc);
  if (!datasets[0]) throw UserError("the training split is empty: check --data-path/--train-data-path and --split");
  return std::make_unique<FileSource>(std::move(datasets));
}

}  // namespace fp8tron
