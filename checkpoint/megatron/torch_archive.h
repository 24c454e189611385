// A torch.save file (PyTorch's zip archive: data.pkl, a protocol-2 pickle whose tensors are
// persistent ids naming the entries data/<key>), read without Python: the pickle as a value tree
// (pickle.h) and its tensors materialized on request. Megatron's legacy checkpoints
// (model_optim_rng.pt) are such files, and so is every chunk of a `.distcp` file. Every entry read
// is checked against the CRC-32 the archive stores for it (zip_crc.h).
#pragma once
#include <torch/torch.h>

#include <map>
#include <memory>
#include <string>
#include <utility>

#include "checkpoint/megatron/pickle.h"

namespace caffe2::serialize {
class PyTorchStreamReader;
}

namespace fp8tron::checkpoint::megatron {

class TorchArchive {
 public:
  // The archive in file `path`; errors name it.
  explicit TorchArchive(const std::string& path);
  // The archive held in `bytes` (a chunk of a larger file); errors name `source`.
  TorchArchive(std::string bytes, std::string source);
  ~TorchArchive();

  const PyRef& root() const { return root_; }
  const std::string& source() const { return source_; }

  // The tensor `v` rebuilds (torch._utils._rebuild_tensor_v2, _rebuild_parameter or
  // torch._tensor._rebuild_from_type_v2 over a storage), as a contiguous CPU tensor that owns its
  // memory; UserError naming `what` otherwise.
  torch::Tensor tensor(const PyRef& v, const std::string& what) const;

 private:
  void open();
  torch::Tensor storage(const PyRef& persistent_id, const std::string& what) const;
  // Entry `record`'s bytes, checked against its stored CRC-32; DamagedCheckpoint naming `what`.
  std::pair<at::DataPtr, size_t> record(const std::string& record, const std::string& what) const;

  std::string source_;
  std::string bytes_;
  std::unique_ptr<std::istream> stream_;
  std::unique_ptr<caffe2::serialize::PyTorchStreamReader> reader_;
  std::map<std::string, uint32_t> crcs_;  // by entry name ("data.pkl", "data/0")
  PyRef root_;
};

}  // namespace fp8tron::checkpoint::megatron
