// Glue between ranks' tensors and the checkpoint format, torch-free.
//
// Saving, on every rank: a RankShardWriter collects the boxes of global tensors this rank
// stores (host pointers or fill callbacks), writes them to one safetensors file in the
// temporary directory, and yields the tensor-table entries describing them; the committing
// rank merges every rank's table (merge_tensor_tables) into the metadata.
//
// Loading, on every rank: a CheckpointReader reads the metadata and copies any box of any
// tensor out of whichever shard files hold it (plan_copies + execute_copies over mmapped
// files), after checking the tensor exists with the dtype and global shape the model expects.
#pragma once
#include <map>
#include <set>
#include <string>
#include <vector>

#include "checkpoint/checkpoint_dir.h"
#include "checkpoint/metadata.h"
#include "checkpoint/resharding.h"
#include "checkpoint/safetensors.h"

namespace fp8tron::checkpoint {

// "rank_00003.safetensors": the shard file of a global rank.
std::string rank_file_name(int rank);

class RankShardWriter {
 public:
  explicit RankShardWriter(std::string file_name);

  // The box `box` of global tensor `name`, `data` holding its bytes row-major (host memory,
  // read during write()). `replicas`: how many ranks hold this same box (this one stores it).
  void add(const std::string& name, DType dtype, const Shape& global_shape, const Box& box,
           const void* data, int replicas = 1);
  // Same, with the bytes produced by `fill` (e.g. copied from device memory in pieces).
  void add(const std::string& name, DType dtype, const Shape& global_shape, const Box& box,
           std::function<void(uint64_t offset, void* dst, size_t n)> fill, int replicas = 1);
  // The elements [begin, end) of `box` in row-major order (a distributed-optimizer shard),
  // stored as one 1-D tensor and described as up to 2*rank-1 boxes.
  void add_flat_range(const std::string& name, DType dtype, const Shape& global_shape,
                      const Box& box, int64_t begin, int64_t end, const void* data);

  // Writes <dir>/<file_name> and returns its stats.
  WriteStats write(const std::string& dir, const WriteOptions& options = {}) const;

  const std::string& file_name() const { return file_; }
  const TensorTable& table() const { return table_; }
  // The stored tensors' keys, in the order of WriteStats::checksums.
  std::vector<std::string> keys() const;

 private:
  std::string unique_key(const std::string& name);
  void record(const std::string& name, DType dtype, const Shape& global_shape, const Box& box,
              const std::string& key, int64_t element_offset, int replicas);

  std::string file_;
  TensorTable table_;
  std::vector<TensorToWrite> tensors_;
  std::map<std::string, int> key_uses_;
};

class CheckpointReader {
 public:
  // Reads and validates <location.path>/fp8tron_checkpoint.json. With `verify_checksums`, every
  // stored tensor a read() touches is hashed once and compared with the checksum its metadata
  // entry records (a mismatch is a UserError naming the file and the tensor).
  explicit CheckpointReader(const CheckpointLocation& location, bool verify_checksums = true);

  const CheckpointLocation& location() const { return location_; }
  const CheckpointMetadata& metadata() const { return metadata_; }
  bool has_tensor(const std::string& name) const { return metadata_.tensors.count(name) > 0; }

  // Copies the box `region` of global tensor `name` into `dst` (row-major, region.shape).
  // UserErrors: no such tensor (with a suggestion), dtype or global shape differing from what
  // the model expects (naming both), missing shards or files, shard files that disagree with
  // the metadata.
  void read(const std::string& name, DType dtype, const Shape& global_shape, const Box& region,
            void* dst);

  // Drops the mappings of the shard files opened so far.
  void close_files() { files_.clear(); }

  // Whether the metadata records checksums (checkpoints of older fp8tron versions do not), and
  // how many stored tensors read() verified so far.
  bool has_checksums() const;
  int64_t tensors_verified() const { return int64_t(verified_.size()); }

 private:
  const SafetensorsFile& file(const std::string& name);
  void verify(const SafetensorsFile& f, const TensorView& v, const ShardEntry& s, const std::string& name);

  CheckpointLocation location_;
  CheckpointMetadata metadata_;
  bool verify_checksums_ = true;
  std::map<std::string, SafetensorsFile> files_;
  std::set<std::pair<std::string, std::string>> verified_;  // (file, key)
};

}  // namespace fp8tron::checkpoint
