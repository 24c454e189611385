// One tensor of a Megatron checkpoint under fp8tron's name: its shape and dtype known from the
// start, its values read when asked. A torch_dist checkpoint's tensors stay on disk until a rank
// reads the boxes it holds (a decoder layer of a stacked tensor, one expert of a stacked MoE
// tensor, a tensor-parallel slice), so loading a large model needs no rank to hold all of it; so do
// a legacy checkpoint's (each a range of its torch.save file, torch_archive.h). A tensor put
// together from pieces of other stored tensors (a weight's optimizer state in the distributed
// optimizer's flat buffers, a legacy tensor joined from its tensor-parallel ranks' parts) is read
// when asked, box by box, by the function that knows where its pieces lie.
#pragma once
#include <torch/torch.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace fp8tron::checkpoint::megatron {

class DcpCheckpoint;

class StoredTensor {
 public:
  StoredTensor() = default;
  // A tensor already in memory.
  StoredTensor(torch::Tensor value);  // NOLINT(google-explicit-constructor): tables of values read as such
  // Element `index` (of its leading dimensions) of the stored tensor `name` of `dcp`.
  StoredTensor(std::shared_ptr<const DcpCheckpoint> dcp, std::string name, std::vector<int64_t> index);
  // A tensor of `shape` and `dtype` whose boxes `read_box` reads; `source` names the stored tensor
  // most of it comes from.
  using BoxReader = std::function<torch::Tensor(const std::vector<int64_t>& offsets, const std::vector<int64_t>& sizes)>;
  StoredTensor(std::vector<int64_t> shape, torch::ScalarType dtype, std::string source, BoxReader read_box);

  const std::vector<int64_t>& shape() const { return shape_; }
  torch::ScalarType dtype() const { return dtype_; }
  int64_t numel() const;
  // The whole tensor.
  torch::Tensor read() const;
  // The box [offsets, offsets + sizes) of it.
  torch::Tensor read(const std::vector<int64_t>& offsets, const std::vector<int64_t>& sizes) const;
  // The stored tensor its values come from ("" when in memory): reads grouped by it read each
  // stored chunk once.
  const std::string& source() const { return name_; }

 private:
  torch::Tensor value_;
  BoxReader read_box_;
  std::shared_ptr<const DcpCheckpoint> dcp_;
  std::string name_;
  std::vector<int64_t> index_, shape_;
  torch::ScalarType dtype_ = torch::kFloat32;
};

}  // namespace fp8tron::checkpoint::megatron
