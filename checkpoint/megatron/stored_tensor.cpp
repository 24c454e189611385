#include "checkpoint/megatron/stored_tensor.h"

#include "checkpoint/megatron/dcp_checkpoint.h"
#include "core/error.h"

namespace fp8tron::checkpoint::megatron {

StoredTensor::StoredTensor(torch::Tensor value)
    : value_(std::move(value)), shape_(value_.sizes().vec()), dtype_(value_.scalar_type()) {}

StoredTensor::StoredTensor(std::shared_ptr<const DcpCheckpoint> dcp, std::string name, std::vector<int64_t> index)
    : dcp_(std::move(dcp)), name_(std::move(name)), index_(std::move(index)) {
  const DcpTensor& stored = dcp_->tensors().at(name_);
  FP8TRON_CHECK(index_.size() <= stored.shape.size(), "indexing " + name_ + " past its dimensions");
  for (size_t d = 0; d < index_.size(); ++d)
    FP8TRON_CHECK(index_[d] >= 0 && index_[d] < stored.shape[d], "indexing " + name_ + " out of range");
  shape_.assign(stored.shape.begin() + int64_t(index_.size()), stored.shape.end());
  dtype_ = stored.dtype;
}

StoredTensor::StoredTensor(std::vector<int64_t> shape, torch::ScalarType dtype, std::string source, BoxReader read_box)
    : read_box_(std::move(read_box)), name_(std::move(source)), shape_(std::move(shape)), dtype_(dtype) {}

int64_t StoredTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape_) n *= d;
  return n;
}

torch::Tensor StoredTensor::read() const { return read(std::vector<int64_t>(shape_.size(), 0), shape_); }

torch::Tensor StoredTensor::read(const std::vector<int64_t>& offsets, const std::vector<int64_t>& sizes) const {
  FP8TRON_CHECK(offsets.size() == shape_.size() && sizes.size() == shape_.size(), "a box of another rank");
  for (size_t d = 0; d < shape_.size(); ++d)
    FP8TRON_CHECK(offsets[d] >= 0 && sizes[d] >= 0 && offsets[d] + sizes[d] <= shape_[d], "a box outside its tensor");
  if (read_box_) {
    torch::Tensor box = read_box_(offsets, sizes);
    FP8TRON_CHECK(box.sizes().vec() == sizes, "a box of a stored tensor read in another shape");
    return box;
  }
  if (!dcp_) {
    torch::Tensor box = value_;
    for (size_t d = 0; d < sizes.size(); ++d) box = box.narrow(int64_t(d), offsets[d], sizes[d]);
    return box;
  }
  // The stored tensor's box: one element along each indexed dimension, then the box.
  std::vector<int64_t> at(index_), extent(index_.size(), 1);
  at.insert(at.end(), offsets.begin(), offsets.end());
  extent.insert(extent.end(), sizes.begin(), sizes.end());
  return dcp_->region(name_, at, extent).view(sizes);
}

}  // namespace fp8tron::checkpoint::megatron
