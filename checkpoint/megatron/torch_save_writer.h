// torch.save's file format written without Python: a zip archive (LibTorch's
// PyTorchStreamWriter) of data.pkl, a protocol-2 pickle (pickle_writer.h) whose tensors are
// torch._utils._rebuild_tensor_v2 calls over persistent ids ('storage', torch.FloatStorage, key,
// 'cpu', numel), and one data/<key> entry per storage. torch.load reads it, with
// weights_only=True too when the pickle names only tensors, containers and allow-listed classes.
// PyTorch's distributed checkpoint stores every chunk of a tensor this way, and Megatron its
// common state.
#pragma once
#include <torch/torch.h>

#include <string>
#include <vector>

#include "checkpoint/megatron/pickle_writer.h"

namespace fp8tron::checkpoint::megatron {

class TorchSaveWriter {
 public:
  // The value that rebuilds `t` (a CPU copy of it, contiguous, is kept for bytes()).
  PyRef tensor(const torch::Tensor& t);
  // The archive of `root`, which may refer to the tensors made by tensor().
  std::string bytes(const PyRef& root) const;

 private:
  std::vector<torch::Tensor> storages_;
};

// The torch.save bytes of one tensor, as PyTorch's FileSystemWriter stores a chunk.
std::string torch_save_tensor(const torch::Tensor& t);

}  // namespace fp8tron::checkpoint::megatron
