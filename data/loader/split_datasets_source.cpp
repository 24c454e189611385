#include "data/loader/split_datasets_source.h"

#include "core/error.h"
#include "core/text.h"

namespace fp8tron {
namespace {

class SplitDatasetsSource : public SampleSource {
 public:
  explicit SplitDatasetsSource(data::SplitDatasets datasets) : datasets_(std::move(datasets)) {}
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
  std::optional<int64_t> size(Split split) const override {
    const auto& d = datasets_[size_t(split)];
    return d ? std::optional<int64_t>(d->size()) : std::nullopt;
  }
  std::string token_origin(Split split, int64_t index, int64_t position) const override {
    const auto& d = datasets_[size_t(split)];
    return d && index < d->size() ? d->token_origin(index, position) : "";
  }

 private:
  data::SplitDatasets datasets_;
};

}  // namespace

std::unique_ptr<SampleSource> make_split_datasets_source(data::SplitDatasets datasets) {
  return std::make_unique<SplitDatasetsSource>(std::move(datasets));
}

}  // namespace fp8tron
