// A PyTorch distributed checkpoint (DCP) directory as Megatron's torch_dist format writes it:
// `.metadata`, a pickle of torch.distributed.checkpoint.metadata.Metadata, names every tensor's
// global shape, dtype and chunks, and where each chunk lies in the `.distcp` files (relative path,
// byte offset, length). Each chunk, and each non-tensor object (Megatron's "common_state": the
// iteration, arguments, scheduler), is stored there as torch.save bytes (torch_archive.h).
#pragma once
#include <torch/torch.h>

#include <map>
#include <string>
#include <vector>

#include "checkpoint/megatron/torch_archive.h"

namespace fp8tron::checkpoint::megatron {

struct DcpStorage {
  std::string file;  // relative to the checkpoint directory
  int64_t offset = 0, length = 0;
};

struct DcpChunk {
  std::vector<int64_t> offsets, sizes;  // the box of the global tensor it holds
  DcpStorage storage;
};

struct DcpTensor {
  std::vector<int64_t> shape;
  torch::ScalarType dtype = torch::kFloat32;
  std::vector<DcpChunk> chunks;
};

class DcpCheckpoint {
 public:
  // Reads dir/.metadata; UserError naming it when it is missing, unreadable or inconsistent.
  explicit DcpCheckpoint(const std::string& dir);

  const std::map<std::string, DcpTensor>& tensors() const { return tensors_; }
  // The global tensor `name`, assembled from its chunks (every element covered once).
  torch::Tensor tensor(const std::string& name) const;
  // The object stored under the first byte entry whose name starts with `prefix`
  // (Megatron's "common_state/shard_0_1"); UserError when there is none.
  std::unique_ptr<TorchArchive> object(const std::string& prefix) const;
  // The names of the stored objects, e.g. "common_state/shard_0_1".
  std::vector<std::string> object_names() const;
  // dir/.metadata, for messages.
  std::string source() const { return dir_ + "/.metadata"; }

 private:
  std::string read_range(const DcpStorage& s, const std::string& what) const;

  std::string dir_;
  std::map<std::string, DcpTensor> tensors_;
  std::map<std::string, DcpStorage> objects_;
};

}  // namespace fp8tron::checkpoint::megatron
