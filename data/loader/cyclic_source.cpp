#include "data/loader/cyclic_source.h"

#include <ATen/CPUGeneratorImpl.h>

#include "core/error.h"
#include "core/text.h"

namespace fp8tron {

CyclicSource::CyclicSource(std::shared_ptr<SampleSource> inner, std::array<int64_t, 3> samples, int64_t micro_batch_size,
                           int64_t data_parallel_size, bool data_sharding)
    : inner_(std::move(inner)), samples_(samples), mbs_(micro_batch_size), dp_(data_parallel_size), sharding_(data_sharding) {
  for (int s = 0; s < 3; ++s) {
    if (!inner_->has(Split(s))) continue;
    if (auto n = inner_->size(Split(s))) samples_[size_t(s)] = *n;
  }
}

const std::vector<int64_t>& CyclicSource::permutation(Split split, int64_t epoch, int64_t n) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto key = std::make_pair(int(split), epoch);
  auto it = permutations_.find(key);
  if (it != permutations_.end()) return it->second;
  // torch.Generator().manual_seed(epoch); torch.randperm(n, generator=g)
  auto gen = at::make_generator<at::CPUGeneratorImpl>(uint64_t(epoch));
  auto perm = torch::randperm(n, gen, torch::TensorOptions().dtype(torch::kInt64));
  std::vector<int64_t> values(perm.data_ptr<int64_t>(), perm.data_ptr<int64_t>() + n);
  if (permutations_.size() > 8) permutations_.erase(permutations_.begin());  // old epochs
  return permutations_.emplace(key, std::move(values)).first->second;
}

int64_t CyclicSource::dataset_index(Split split, int64_t index) const {
  const int64_t total = samples_[size_t(split)], batch = mbs_ * dp_;
  const int64_t active = total - total % batch;
  if (active <= 0)
    throw UserError(strprintf("--dataloader-type cyclic: the split has %lld samples, fewer than one micro-batch x "
                              "data-parallel size (%lld)",
                              (long long)total, (long long)batch));
  const int64_t consumed = index - index % batch, rank = (index % batch) / mbs_, j = index % mbs_;
  const int64_t epoch = consumed / active, pos = consumed % active;
  if (sharding_) {
    const int64_t bucket = (total / batch) * mbs_;
    return rank * bucket + permutation(split, epoch, bucket)[size_t(pos / dp_ + j)];
  }
  const int64_t full = (total / mbs_) * mbs_;
  return permutation(split, epoch, full)[size_t(pos + j * dp_ + rank)];
}

void CyclicSource::sample(Split split, int64_t index, int64_t* out) const {
  inner_->sample(split, dataset_index(split, index), out);
}

}  // namespace fp8tron
