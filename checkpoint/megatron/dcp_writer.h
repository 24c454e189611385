// Writing a PyTorch distributed checkpoint (DCP) directory as PyTorch's FileSystemWriter and
// Megatron's torch_dist strategy do (dcp_checkpoint.h reads it): every rank writes its items into
// __<rank>_0.distcp, each tensor chunk as the torch.save bytes of that chunk and each object as
// the torch.save bytes Megatron made of it; rank 0 then writes `.metadata`, the pickled
// torch.distributed.checkpoint.metadata.Metadata naming every tensor's global shape, dtype and
// chunks and where every item lies (file, byte offset, length).
#pragma once
#include <torch/torch.h>

#include <string>
#include <vector>

namespace fp8tron::checkpoint::megatron {

// One chunk of the global tensor `fqn`: `data` holds the box at `offsets` (its shape the box's).
struct DcpChunkToWrite {
  std::string fqn;
  std::vector<int64_t> global_shape, offsets;
  torch::Tensor data;
};

// One object (a Megatron ShardedObject, e.g. "common_state/shard_0_1"): its torch.save bytes.
struct DcpObjectToWrite {
  std::string fqn;
  std::string bytes;
};

// Writes dir/__<rank>_0.distcp with `objects` then `chunks` (chunks must not overlap across
// ranks). Returns this rank's entries for the metadata, as text to gather on rank 0.
std::string write_dcp_file(const std::string& dir, int rank, const std::vector<DcpObjectToWrite>& objects,
                           const std::vector<DcpChunkToWrite>& chunks);

// Rank 0: dir/.metadata from every rank's entries (write_dcp_file's results). `checkpoint_id` is
// recorded as PyTorch records the directory it saved to. UserError when two ranks wrote the same
// item, a tensor's dtype or global shape differs between its chunks, or the chunks of a tensor do
// not cover it exactly.
void write_dcp_metadata(const std::string& dir, const std::vector<std::string>& rank_entries,
                        const std::string& checkpoint_id);

}  // namespace fp8tron::checkpoint::megatron
