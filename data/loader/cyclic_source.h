// --dataloader-type cyclic: Megatron's MegatronPretrainingRandomSampler cycled forever, as a view
// of another sample source. The trainer keeps asking for logical sample indices in Megatron's
// single-sampler order (micro-batch m of data-parallel rank r after C consumed samples starts at
// C + m x mbs x dp + r x mbs); this view maps each to the dataset index the random sampler gives
// there:
//   T samples, B = mbs x dp, active = T - T mod B, epoch = C div active, pos = C mod active;
//   with data sharding (default) rank r owns the bucket [r x bk, (r + 1) x bk), bk = (T div B) x mbs,
//   and reads r x bk + perm(bk)[pos / dp + j]; without (--no-data-sharding) perm((T div mbs) x mbs)
//   [pos + j x dp + r]; perm(n) = torch.randperm(n) from a CPU generator seeded with the epoch.
#pragma once
#include <torch/torch.h>

#include <array>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "data/loader/sample_source.h"

namespace fp8tron {

class CyclicSource : public SampleSource {
 public:
  // `samples`: each split's size T (the dataset's, or what it was sized for).
  CyclicSource(std::shared_ptr<SampleSource> inner, std::array<int64_t, 3> samples, int64_t micro_batch_size,
               int64_t data_parallel_size, bool data_sharding);
  void sample(Split split, int64_t index, int64_t* out) const override;
  bool has(Split split) const override { return inner_->has(split); }
  std::optional<int64_t> size(Split split) const override { return inner_->size(split); }
  std::string token_origin(Split split, int64_t index, int64_t position) const override {
    return inner_->token_origin(split, dataset_index(split, index), position);
  }
  // The dataset index logical sample `index` of `split` reads (exposed for tests).
  int64_t dataset_index(Split split, int64_t index) const;

 private:
  const std::vector<int64_t>& permutation(Split split, int64_t epoch, int64_t n) const;

  std::shared_ptr<SampleSource> inner_;
  std::array<int64_t, 3> samples_;
  int64_t mbs_, dp_;
  bool sharding_;
  mutable std::mutex mutex_;
  mutable std::map<std::pair<int, int64_t>, std::vector<int64_t>> permutations_;  // (split, epoch)
};

}  // namespace fp8tron
