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
  std::vector<DcpChunk> chunks;  // boxes of the tensor as stored
  // Megatron's flattened optimizer states (the distributed optimizer's fully_sharded_model_space
  // layout, Megatron-Core up to 0.14's default): each data-parallel rank stores its range of a
  // weight's model-parallel chunk flattened, and Megatron's torch_dist strategy stores them as one
  // tensor of shape (the weight's chunks along each axis..., the elements of one chunk). `shape` is
  // the weight's then, and `chunk` the shape of one model-parallel chunk; empty for a tensor stored
  // as it is.
  std::vector<int64_t> chunk;
};

class DcpCheckpoint {
 public:
  // Reads dir/.metadata; UserError naming it when it is missing, unreadable or inconsistent, or
  // naming a .distcp file that is missing or shorter than .metadata says.
  explicit DcpCheckpoint(const std::string& dir, int64_t kept_chunk_bytes = kKeptChunkBytes);

  const std::map<std::string, DcpTensor>& tensors() const { return tensors_; }
  // The global tensor `name`, assembled from its chunks (every element covered once).
  torch::Tensor tensor(const std::string& name) const;
  // The box [offsets, offsets + sizes) of tensor `name`, from the chunks it overlaps. The chunks
  // read stay in memory, the least recently used dropped once they pass kept_chunk_bytes (never
  // those of the box being read), so boxes asked for tensor by tensor, or alternating between a
  // few tensors (the tensor-parallel parts of a weight in several ranks' buffers), read each chunk
  // once.
  torch::Tensor region(const std::string& name, const std::vector<int64_t>& offsets,
                       const std::vector<int64_t>& sizes) const;
  // Chunk `index` of tensor `name` (in .metadata's order), read and not kept.
  torch::Tensor chunk(const std::string& name, size_t index) const;
  // Drops the chunks kept by region().
  void forget_chunks() const;
  static constexpr int64_t kKeptChunkBytes = int64_t(1) << 30;
  // Bytes of tensor chunks read from the .distcp files so far, and all of them.
  int64_t bytes_read() const { return bytes_read_; }
  int64_t tensor_bytes() const;
  // The object stored under the first byte entry whose name starts with `prefix`
  // (Megatron's "common_state/shard_0_1"); UserError when there is none.
  std::unique_ptr<TorchArchive> object(const std::string& prefix) const;
  // Megatron's common state (iteration, arguments, scheduler, optimizer parameter groups):
  // Megatron-Core up to 0.18 saves it in common.pt beside the .distcp files, later versions as
  // the object "common_state" inside; UserError when there is neither.
  std::unique_ptr<TorchArchive> common_state() const;
  // The state dict in it (later versions wrap it in a list of one).
  static PyRef common_state_dict(const TorchArchive& common);
  // The names of the stored objects, e.g. "common_state/shard_0_1".
  std::vector<std::string> object_names() const;
  // dir/.metadata, for messages.
  std::string source() const { return dir_ + "/.metadata"; }

 private:
  void check_present(const DcpStorage& s, const std::string& what) const;
  void check_files() const;
  std::string read_range(const DcpStorage& s, const std::string& what) const;
  torch::Tensor read_chunk(const std::string& name, const DcpChunk& c) const;
  torch::Tensor box(const std::string& name, const std::vector<int64_t>& offsets, const std::vector<int64_t>& sizes,
                    bool keep_chunks) const;
  // box() of the stored tensor, in its own coordinates.
  torch::Tensor stored_box(const std::string& name, const std::vector<int64_t>& offsets,
                           const std::vector<int64_t>& sizes, bool keep_chunks) const;
  // box() of a flattened optimizer state (DcpTensor::chunk), from the model-parallel chunks it overlaps.
  torch::Tensor model_space_box(const std::string& name, const std::vector<int64_t>& offsets,
                                const std::vector<int64_t>& sizes, bool keep_chunks) const;
  // Gives Megatron's flattened optimizer states their weights' shapes (DcpTensor::chunk).
  void view_flattened_states_as_weights();

  std::string dir_;
  int64_t kept_chunk_bytes_;
  std::map<std::string, DcpTensor> tensors_;
  std::map<std::string, DcpStorage> objects_;
  // region()'s chunks by (tensor, index in its chunk list), and when each was last used.
  struct KeptChunk {
    torch::Tensor values;
    int64_t last_use = 0;
  };
  void drop_unused_chunks(int64_t in_use) const;
  mutable std::map<std::pair<std::string, size_t>, KeptChunk> kept_chunks_;
  mutable int64_t kept_bytes_ = 0, uses_ = 0;
  mutable int64_t bytes_read_ = 0;
};

}  // namespace fp8tron::checkpoint::megatron
